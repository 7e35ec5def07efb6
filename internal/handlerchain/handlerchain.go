// Package handlerchain is the core that the middleware of every scope
// (consumer.Middleware, dbscope.Middleware, txn.Middleware) shares: the
// order of a chain, and the deadline of a handler call with what its
// failure becomes. Each scope keeps its own public types; this package is
// generic over them.
package handlerchain

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kscope-dev/kscope/internal/guard"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Chain wraps h in m: m[0] is the outermost middleware (it runs first and
// sees the result last), m[len(m)-1] the innermost, right around h. A nil
// middleware is skipped.
func Chain[H any, M ~func(H) H](h H, m []M) H {
	for i := len(m) - 1; i >= 0; i-- {
		if m[i] != nil {
			h = m[i](h)
		}
	}
	return h
}

// ErrTimeout is matched (errors.Is) by the error of a handler call that
// failed once its deadline had passed (consumer.ErrHandlerTimeout).
var ErrTimeout = errors.New("kscope: the handler call ran past its deadline")

// Deadline runs call with a context that ends after d (d <= 0: no
// deadline) and returns its error, made a timeout's by [Timed].
func Deadline(ctx context.Context, d time.Duration, call func(ctx context.Context) error) error {
	if d <= 0 {
		return call(ctx)
	}
	tctx, cancel := context.WithTimeoutCause(ctx, d, errDeadline)
	err := call(tctx)
	cancel()
	return Timed(tctx, err, d)
}

// errDeadline is the cause of a deadline set by Deadline or the runner's
// HandlerTimeout: it tells that deadline from one of the caller's.
var errDeadline = errors.New("kscope: handler deadline")

// WithDeadline returns ctx with a deadline d from now whose cause [Timed]
// recognises, and its cancel function.
func WithDeadline(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, d, errDeadline)
}

// Timed returns the error err of a call whose context was tctx (made by
// [WithDeadline] or Deadline, of d): when the call failed after that
// deadline passed, an error that matches [ErrTimeout] and err, of err's
// class when it has one and of class retryable otherwise (a deadline is a
// transient failure: the next attempt may be in time). A panic keeps its
// own error, and a call that succeeded succeeded.
func Timed(tctx context.Context, err error, d time.Duration) error {
	if err == nil || !errors.Is(context.Cause(tctx), errDeadline) {
		return err
	}
	if _, ok := errors.AsType[*guard.PanicError](err); ok {
		return err
	}
	te := &timeoutError{d: d, err: err}
	if retrytopic.ClassOf(err) != retrytopic.ClassUnknown {
		return te // its class, marked inside, still decides its route
	}
	return retrytopic.Retryable(te)
}

// timeoutError is a handler error after its call's deadline.
type timeoutError struct {
	d   time.Duration
	err error
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("kscope: the handler call failed after its deadline (%s): %v", e.d, e.err)
}

func (e *timeoutError) Unwrap() []error { return []error{ErrTimeout, e.err} }

// Recover runs call and turns a panic in it into an error that carries the
// panic's stack (a *guard.PanicError), as the runner's own guard does.
func Recover(call func() error) error { return guard.Call(call) }
