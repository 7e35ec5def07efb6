package consumer

import (
	"context"
	"errors"
)

// runnerKey is the context key of the runner whose records a context's
// handler handles.
type runnerKey struct{}

// assignCtx is the parent context of a partition assignment: the
// session's hard context, carrying the runner for PauseFrom. Every handler
// context of the assignment's records derives from it.
func (r *Runner) assignCtx() context.Context {
	return context.WithValue(r.hardCtx, runnerKey{}, r)
}

// ErrNotHandlerContext is returned by [PauseFrom] for a context that is
// not (derived from) the context a runner gave a handler.
var ErrNotHandlerContext = errors.New("kscope: PauseFrom: the context is not a handler's; call it with the context the handler was given, or call Runner.Pause")

// PauseFrom is a handler's decision to pause: it pauses t on the runner
// that called the handler whose context ctx is (or derives from), as
// [Runner.Pause] does, in every scope and from batch handlers too. A
// handler that finds its dependency down pauses its topic, for a while
// ([PauseFor]) or until the service resumes it, and returns its error. The
// pause stops fetching, not the records already polled: the record in hand
// follows the failure policy (its retries in place go on), and the others
// polled before the pause finish. See docs/flow-control.md.
func PauseFrom(ctx context.Context, t Target, opts ...PauseOption) error {
	r, _ := ctx.Value(runnerKey{}).(*Runner)
	if r == nil {
		return ErrNotHandlerContext
	}
	return r.Pause(t, opts...)
}
