package dbscope

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/handlerchain"
)

// Middleware wraps a [Handler] of the DB scope: it changes what the
// handler does (a deadline, a panic turned into an error, a log line
// around each call), where hooks only observe. Build a chain with [Chain];
// kscope's own middleware are [Recover] and [Timeout]. A middleware runs
// inside the record's transaction: what it writes through tx commits or
// rolls back with the record's writes.
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
// the runner's own guard does: the record's writes roll back to its
// savepoint and the failure policy routes it. Place it where the
// middleware around it should see a panic as an error.
func Recover() Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			return handlerchain.Recover(func() error { return next.Handle(ctx, tx, r) })
		})
	}
}

// Timeout returns middleware that puts a deadline d on the context of the
// handlers it wraps (their statements through tx are canceled with it),
// with consumer.Config.HandlerTimeout's meaning: a call that fails once
// the deadline passed fails with an error that matches
// consumer.ErrHandlerTimeout, of class retryable unless the handler's
// error has a class of its own. d <= 0 sets no deadline.
func Timeout(d time.Duration) Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			return handlerchain.Deadline(ctx, d, func(ctx context.Context) error { return next.Handle(ctx, tx, r) })
		})
	}
}

// QueueMiddleware wraps a [QueueHandler] as [Middleware] wraps a Handler.
// A queued handler runs before its record's transaction: a middleware sees
// the statements it queued, not their result.
type QueueMiddleware func(QueueHandler) QueueHandler

// ChainQueue is [Chain] for a QueueHandler: m[0] is the outermost. A
// chain around a [QueueRouter] keeps its construction check.
func ChainQueue(h QueueHandler, m ...QueueMiddleware) QueueHandler {
	c := handlerchain.Chain(h, m)
	if rc, ok := h.(consumer.RouteChecker); ok {
		return routedQueueChain{c, rc}
	}
	return c
}

// routedQueueChain is a queued chain around a RouteChecker.
type routedQueueChain struct {
	QueueHandler
	rc consumer.RouteChecker
}

// CheckRoutes implements consumer.RouteChecker.
func (c routedQueueChain) CheckRoutes(cfg consumer.Config) error { return c.rc.CheckRoutes(cfg) }

// RecoverQueue is [Recover] for a QueueHandler: a panic becomes its error,
// and what it queued is not sent.
func RecoverQueue() QueueMiddleware {
	return func(next QueueHandler) QueueHandler {
		return QueueFunc(func(ctx context.Context, q *Queue, r *consumer.Record) error {
			return handlerchain.Recover(func() error { return next.Queue(ctx, q, r) })
		})
	}
}

// TimeoutQueue is [Timeout] for a QueueHandler.
func TimeoutQueue(d time.Duration) QueueMiddleware {
	return func(next QueueHandler) QueueHandler {
		return QueueFunc(func(ctx context.Context, q *Queue, r *consumer.Record) error {
			return handlerchain.Deadline(ctx, d, func(ctx context.Context) error { return next.Queue(ctx, q, r) })
		})
	}
}
