package consumer

import (
	"context"
	"errors"

	"github.com/kscope-dev/kscope/internal/route"
)

// ErrNoRoute is wrapped by the error a [Router] (or dbscope.Router,
// txn.Router) fails a record with when no route takes it and the router
// has no default. That error is terminal: the record goes to the
// dead-letter topic at once, with the error, which names its topic (and
// the header values its topic's routes looked for), in its failure
// metadata. Nothing is lost, and the record can be redriven once a route
// for it is deployed.
var ErrNoRoute = route.ErrNoRoute

// Router is a [Handler] that hands each record to the handler registered
// for it, so that one runner consumes several topics: by its topic
// (Topic), by a header value on its topic (Header, such as an event
// type), by a regular expression its topic matches (Pattern, for topics
// consumed through Config.TopicPatterns), or else the default (Default).
// For a record, the topic's header routes are tried first, in the order
// registered, then the topic's route, the patterns in order, and the
// default.
//
// A record consumed from a retry topic is routed by the topic it was first
// consumed from (its HeaderOriginalTopic), so that its retries reach the
// handler of its first attempt.
//
// [New] checks the router against the configuration (see
// [RouteChecker]): a topic of Config.Topics no route takes, a pattern of
// Config.TopicPatterns without a Pattern route of the same expression,
// and a route for a topic the runner does not consume fail construction,
// unless there is a default. A record no route takes at run time (a
// header value no Header route names, on a topic with no Topic route)
// fails with an error wrapping [ErrNoRoute], which is terminal: it goes to
// the dead-letter topic. Set a Default to handle such records instead.
//
// Register every route before the runner is built; the methods return the
// router, for chaining. A Router is safe for concurrent Handle calls.
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
// (Go syntax, matching anywhere in the name unless anchored) matches to h,
// when no Topic or Header route takes them. Give it the same expression as
// Config.TopicPatterns to route the topics consumed through it.
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
// terminal error wrapping [ErrNoRoute].
func (r *Router) Handle(ctx context.Context, rec *Record) error {
	h, err := r.t.Lookup(rec.Topic, rec.Header)
	if err != nil {
		return Terminal(err)
	}
	return h.Handle(ctx, rec)
}

// CheckRoutes implements [RouteChecker].
func (r *Router) CheckRoutes(cfg Config) error { return checkTable(&r.t, "consumer.Router", cfg) }

// RouteChecker is implemented by a handler that routes records by topic
// (the routers of kscope's three scopes). The scopes' constructors
// ([New], dbscope.New, dbscope.NewQueued, txn.New) find it by type
// assertion on the handler they are given and fail with its error, so
// that a configuration whose records could not all be routed is refused
// before it runs. [Chain] (and dbscope.Chain, txn.Chain) forward the
// check of the router they wrap; a wrapper of a service's own hides it,
// unless it implements RouteChecker too, forwarding the call.
type RouteChecker interface {
	// CheckRoutes returns nil when every topic cfg consumes has a route,
	// or an error (a *ConfigError, or several joined) that names each
	// problem and says what to change.
	CheckRoutes(cfg Config) error
}

// CheckRoutes returns h's CheckRoutes(cfg) when h is a [RouteChecker],
// else nil: the check the scopes' constructors run on their handler.
func CheckRoutes(cfg Config, h any) error {
	if rc, ok := h.(RouteChecker); ok {
		return rc.CheckRoutes(cfg)
	}
	return nil
}

// checkTable is a router's CheckRoutes: each problem of the table t
// against cfg's topics and patterns, as a *ConfigError; what names the
// router's type ("consumer.Router").
func checkTable[H any](t *route.Table[H], what string, cfg Config) error {
	var errs []error
	for _, p := range t.Check(what, cfg.Topics, cfg.TopicPatterns) {
		e := &ConfigError{Field: p.Field, Reason: p.Reason}
		if p.Field == "" {
			e.Struct = what
		}
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}
