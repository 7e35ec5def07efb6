package consumer

import (
	"context"
	"time"

	"github.com/kscope-dev/kscope/internal/handlerchain"
)

// Middleware wraps a [Handler] of the AtLeastOnce scope: it changes what
// the handler does (a deadline, a panic turned into an error, a log line
// around each call, a decode step), where hooks only observe. Build a chain
// with [Chain]; kscope's own middleware are [Recover] and [Timeout].
type Middleware func(Handler) Handler

// Chain returns h wrapped in m, in order: m[0] is the outermost (it runs
// first and sees the result last), the last one wraps h itself. Chain(h,
// Logging, Recover()) lets Logging see a panic of h as an error; Chain(h,
// Recover(), Logging) recovers a panic of Logging too. A nil middleware is
// skipped.
//
// The runner calls the chain as it calls any handler: after the admission
// rules (Config.Keep, MaxAge), under Config.HandlerTimeout's deadline and
// inside its own panic guard, which stays outermost as the last line of
// defence whether or not the chain holds a Recover.
//
// A chain around a [Router] (any [RouteChecker]) keeps its construction
// check: the runner checks the routes of the handler the chain wraps.
func Chain(h Handler, m ...Middleware) Handler {
	c := handlerchain.Chain(h, m)
	if rc, ok := h.(RouteChecker); ok {
		return routedChain{c, rc}
	}
	return c
}

// routedChain is a chain around a RouteChecker, which it answers for.
type routedChain struct {
	Handler
	rc RouteChecker
}

// CheckRoutes implements RouteChecker.
func (c routedChain) CheckRoutes(cfg Config) error { return c.rc.CheckRoutes(cfg) }

// Recover returns middleware that turns a panic in the handlers it wraps
// into their error, with the panic's stack, as the runner's own guard
// does: the record fails (class unknown) and is routed by the failure
// policy, and the stack is logged once per record. Place it where the
// middleware around it should see a panic as an error.
func Recover() Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, r *Record) error {
			return handlerchain.Recover(func() error { return next.Handle(ctx, r) })
		})
	}
}

// Timeout returns middleware that puts a deadline d on the context of the
// handlers it wraps, with Config.HandlerTimeout's meaning: a call that
// fails once the deadline passed fails with an error that matches
// [ErrHandlerTimeout], of class retryable unless the handler's error has a
// class of its own. Unlike HandlerTimeout, it does not report a call that
// runs on past its deadline; the runner's stall watch (Config.StallWarning)
// does. d <= 0 sets no deadline.
func Timeout(d time.Duration) Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, r *Record) error {
			return handlerchain.Deadline(ctx, d, func(ctx context.Context) error { return next.Handle(ctx, r) })
		})
	}
}
