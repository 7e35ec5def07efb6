package dbscope

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/route"
)

// Router is a [Handler] that hands each record to the DB-scope handler
// registered for it, so that one runner consumes several topics: by its
// topic (Topic), by a header value on its topic (Header, such as an event
// type), by a regular expression its topic matches (Pattern, for topics
// consumed through consumer.Config.TopicPatterns), or else the default
// (Default). It routes as consumer.Router does (see there: the order of
// the routes, a record on a retry topic routed by its original topic) and
// changes nothing of the DB scope: the routed handler runs in the
// record's transaction, beside its inbox row.
//
// [New] checks the router against the configuration
// (consumer.RouteChecker): a topic of Config.Topics no route takes fails
// construction, unless there is a default. A record no route takes at run
// time fails with a terminal error wrapping consumer.ErrNoRoute: like any
// failing record, it is rolled back and goes to the dead-letter topic.
// Set a Default to handle such records instead.
type Router struct{ t route.Table[Handler] }

// NewRouter returns a router with no routes.
func NewRouter() *Router { return &Router{} }

// Topic routes the records of topic to h.
func (r *Router) Topic(topic string, h Handler) *Router {
	r.t.Topic(topic, h, h == nil)
	return r
}

// Header routes the records of topic whose header key has the value value
// (the last header of that name) to h, before the topic's own route.
func (r *Router) Header(topic, key, value string, h Handler) *Router {
	r.t.Header(topic, key, value, h, h == nil)
	return r
}

// Pattern routes the records of every topic the regular expression expr
// matches to h, when no Topic or Header route takes them.
func (r *Router) Pattern(expr string, h Handler) *Router {
	r.t.Pattern(expr, h, h == nil)
	return r
}

// Default routes every record no other route takes to h.
func (r *Router) Default(h Handler) *Router {
	r.t.Default(h, h == nil)
	return r
}

// Handle hands rec to the handler its route names, in tx, or fails it
// with a terminal error wrapping consumer.ErrNoRoute.
func (r *Router) Handle(ctx context.Context, tx pgx.Tx, rec *consumer.Record) error {
	h, err := r.t.Lookup(rec.Topic, rec.Header)
	if err != nil {
		return consumer.Terminal(err)
	}
	return h.Handle(ctx, tx, rec)
}

// CheckRoutes implements consumer.RouteChecker.
func (r *Router) CheckRoutes(cfg consumer.Config) error {
	return checkTable(&r.t, "dbscope.Router", cfg)
}

// QueueRouter is [Router] for a [QueueHandler] ([NewQueued]): the same
// routes, to handlers that queue their statements.
type QueueRouter struct{ t route.Table[QueueHandler] }

// NewQueueRouter returns a queue router with no routes.
func NewQueueRouter() *QueueRouter { return &QueueRouter{} }

// Topic routes the records of topic to h.
func (r *QueueRouter) Topic(topic string, h QueueHandler) *QueueRouter {
	r.t.Topic(topic, h, h == nil)
	return r
}

// Header routes the records of topic whose header key has the value value
// to h, before the topic's own route.
func (r *QueueRouter) Header(topic, key, value string, h QueueHandler) *QueueRouter {
	r.t.Header(topic, key, value, h, h == nil)
	return r
}

// Pattern routes the records of every topic the regular expression expr
// matches to h, when no Topic or Header route takes them.
func (r *QueueRouter) Pattern(expr string, h QueueHandler) *QueueRouter {
	r.t.Pattern(expr, h, h == nil)
	return r
}

// Default routes every record no other route takes to h.
func (r *QueueRouter) Default(h QueueHandler) *QueueRouter {
	r.t.Default(h, h == nil)
	return r
}

// Queue hands rec to the handler its route names, or fails it with a
// terminal error wrapping consumer.ErrNoRoute.
func (r *QueueRouter) Queue(ctx context.Context, q *Queue, rec *consumer.Record) error {
	h, err := r.t.Lookup(rec.Topic, rec.Header)
	if err != nil {
		return consumer.Terminal(err)
	}
	return h.Queue(ctx, q, rec)
}

// CheckRoutes implements consumer.RouteChecker.
func (r *QueueRouter) CheckRoutes(cfg consumer.Config) error {
	return checkTable(&r.t, "dbscope.QueueRouter", cfg)
}

// checkTable returns each problem of t against cfg's topics and patterns
// as a *consumer.ConfigError.
func checkTable[H any](t *route.Table[H], what string, cfg consumer.Config) error {
	var errs []error
	for _, p := range t.Check(what, cfg.Topics, cfg.TopicPatterns) {
		e := &consumer.ConfigError{Field: p.Field, Reason: p.Reason}
		if p.Field == "" {
			e.Struct = what
		}
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}
