package txn

import (
	"context"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/handlerchain"
)

// Middleware wraps a [Handler] of the Kafka scope: it changes what the
// handler does (a deadline, a panic turned into an error, a log line
// around each call), where hooks only observe. Build a chain with [Chain];
// kscope's own middleware are [Recover] and [Timeout]. What a middleware
// emits through out joins the input's transaction, as the handler's own
// outputs do: produced only if the call returns nil.
type Middleware func(Handler) Handler

// Chain returns h wrapped in m, in order: m[0] is the outermost (it runs
// first and sees the result last), the last one wraps h itself. A nil
// middleware is skipped. The runner calls the chain as it calls any
// handler: after the admission rules (consumer.Config.Keep, MaxAge), under
// consumer.Config.HandlerTimeout's deadline and inside its own panic
// guard, which stays outermost whether or not the chain holds a Recover.
//
// A chain around a [Router] keeps its construction check: the runner
// checks the routes of the handler the chain wraps.
func Chain(h Handler, m ...Middleware) Handler {
	c := handlerchain.Chain(h, m)
	if rc, ok := h.(consumer.RouteChecker); ok {
		return routedChain{c, rc}
	}
	return c
}

// routedChain is a chain around a RouteChecker, which it answers for.
type routedChain struct {
	Handler
	rc consumer.RouteChecker
}

// CheckRoutes implements consumer.RouteChecker.
func (c routedChain) CheckRoutes(cfg consumer.Config) error { return c.rc.CheckRoutes(cfg) }

// Recover returns middleware that turns a panic in the handlers it wraps
// into their error, with the panic's stack (logged once per record), as
// the runner's own guard does: the call's outputs are dropped and the
// failure policy routes the record. Place it where the middleware around
// it should see a panic as an error.
func Recover() Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, r *consumer.Record, out Emitter) error {
			return handlerchain.Recover(func() error { return next.Handle(ctx, r, out) })
		})
	}
}

// Timeout returns middleware that puts a deadline d on the context of the
// handlers it wraps, with consumer.Config.HandlerTimeout's meaning: a call
// that fails once the deadline passed fails with an error that matches
// consumer.ErrHandlerTimeout, of class retryable unless the handler's
// error has a class of its own. d <= 0 sets no deadline.
func Timeout(d time.Duration) Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, r *consumer.Record, out Emitter) error {
			return handlerchain.Deadline(ctx, d, func(ctx context.Context) error { return next.Handle(ctx, r, out) })
		})
	}
}
