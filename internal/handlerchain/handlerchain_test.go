package handlerchain_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/internal/guard"
	"github.com/kscope-dev/kscope/internal/handlerchain"
	"github.com/kscope-dev/kscope/retrytopic"
)

// What a call's error becomes under its deadline: a failure after the
// deadline is a timeout, retryable unless it has a class of its own; a
// success stays one, a panic keeps its error, and the end of the caller's
// own context is not a timeout.
func TestDeadline(t *testing.T) {
	waits := func(err error) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			<-ctx.Done()
			return err
		}
	}
	declined := errors.New("declined")
	for _, tc := range []struct {
		name    string
		call    func(ctx context.Context) error
		timeout bool
		class   retrytopic.Class
	}{
		{"unclassified", waits(context.DeadlineExceeded), true, retrytopic.ClassRetryable},
		{"its own class", waits(retrytopic.Terminal(declined)), true, retrytopic.ClassTerminal},
		{"success after the deadline", waits(nil), false, retrytopic.ClassUnknown},
		{"in time", func(context.Context) error { return declined }, false, retrytopic.ClassUnknown},
		{"panic", func(ctx context.Context) error {
			<-ctx.Done()
			return handlerchain.Recover(func() error { panic("boom") })
		}, false, retrytopic.ClassUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := handlerchain.Deadline(context.Background(), 5*time.Millisecond, tc.call)
			if got := errors.Is(err, handlerchain.ErrTimeout); got != tc.timeout {
				t.Fatalf("error %v: a timeout %v, want %v", err, got, tc.timeout)
			}
			if err != nil && retrytopic.ClassOf(err) != tc.class {
				t.Fatalf("error %v of class %s, want %s", err, retrytopic.ClassOf(err), tc.class)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if err := handlerchain.Deadline(ctx, time.Hour, waits(context.DeadlineExceeded)); errors.Is(err, handlerchain.ErrTimeout) {
		t.Fatalf("the caller's own deadline made %v a handler timeout", err)
	}
	var pe *guard.PanicError
	if err := handlerchain.Recover(func() error { panic("boom") }); !errors.As(err, &pe) || len(pe.Stack) == 0 {
		t.Fatalf("Recover returned %v; want a *guard.PanicError with its stack", err)
	}
}
