package txn

import (
	"context"
	"errors"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/route"
)

// Router is a [Handler] that hands each record to the Kafka-scope handler
// registered for it, so that one runner consumes several topics: by its
// topic (Topic), by a header value on its topic (Header, such as an event
// type), by a regular expression its topic matches (Pattern), or else the
// default (Default). It routes as consumer.Router does (see there: the
// order of the routes, a record on a retry topic routed by its original
// topic) and changes nothing of the Kafka scope: the routed handler's
// outputs are produced in the input's transaction. (The Kafka scope
// consumes named topics only: consumer.Config.TopicPatterns is refused.)
//
// [New] checks the router against the configuration
// (consumer.RouteChecker): a topic of Config.Topics no route takes fails
// construction, unless there is a default. A record no route takes at run
// time fails with a terminal error wrapping consumer.ErrNoRoute: it goes
// to the dead-letter topic inside its transaction, with no output. Set a
// Default to handle such records instead.
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

// Handle hands rec to the handler its route names, or fails it with a
// terminal error wrapping consumer.ErrNoRoute.
func (r *Router) Handle(ctx context.Context, rec *consumer.Record, out Emitter) error {
	h, err := r.t.Lookup(rec.Topic, rec.Header)
	if err != nil {
		return consumer.Terminal(err)
	}
	return h.Handle(ctx, rec, out)
}

// CheckRoutes implements consumer.RouteChecker.
func (r *Router) CheckRoutes(cfg consumer.Config) error {
	var errs []error
	for _, p := range r.t.Check("txn.Router", cfg.Topics, cfg.TopicPatterns) {
		e := &consumer.ConfigError{Field: p.Field, Reason: p.Reason}
		if p.Field == "" {
			e.Struct = "txn.Router"
		}
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}
