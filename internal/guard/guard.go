// Package guard runs a user's handler so that a panic in it becomes an
// error: one bad record must not take the process down with every other
// key-shard's work. Every scope calls its handlers through it.
package guard

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
)

// Call runs fn and returns its error, or a *PanicError that carries the
// panic's value and stack when fn panicked. An error whose Error method
// panics is replaced by one that says so (see brokenError).
func Call(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = Recovered("kscope: handler panicked: ", p)
		}
	}()
	if err = fn(); err != nil {
		err = checked(err)
	}
	return err
}

// Handle is Call for a handler's method: it runs h.Handle(ctx, v) without a
// closure around it, for the path that calls a handler once per record.
func Handle[T any, H interface {
	Handle(context.Context, T) error
}](ctx context.Context, h H, v T) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = Recovered("kscope: handler panicked: ", p)
		}
	}()
	if err = h.Handle(ctx, v); err != nil {
		err = checked(err)
	}
	return err
}

// PanicError is a panic turned into an error. Its message is the panic's
// value alone, so that the log lines of every attempt of a record stay
// short; the stack is logged once per record, in an attribute of its own
// (consumer's failure policy does that).
type PanicError struct {
	Value any
	// Stack is the stack of the goroutine that panicked, where it did.
	Stack []byte

	prefix string
}

// Recovered returns the error of a panic of value p, recovered by the
// caller's deferred function (the stack is taken there); its message is
// prefix followed by p.
func Recovered(prefix string, p any) *PanicError {
	return &PanicError{Value: p, Stack: debug.Stack(), prefix: prefix}
}

func (e *PanicError) Error() string { return e.prefix + fmt.Sprint(e.Value) }

// checked returns err, or a brokenError for it when its Error method
// panics. The runner reads the message outside the guard (to log and route
// the failure), and a panic there would take the process down; the most
// common cause is a nil *T returned as an error, which is not a nil error.
func checked(err error) error {
	p, ok := panics(err)
	if !ok {
		return err
	}
	// Name the innermost error at fault, not the marks around it
	// (Retryable(err) panics because err does).
	at := err
	for {
		next, ok := unwrap(at)
		if !ok {
			break
		}
		q, ok := panics(next)
		if !ok {
			break
		}
		at, p = next, q
	}
	return &brokenError{err: err, msg: fmt.Sprintf("kscope: the handler returned an error (%T) whose Error method panicked: %v; "+
		"a nil pointer returned as an error is not a nil error: return a literal nil on success", at, p)}
}

// panics reports whether err's Error method panics, and with what.
func panics(err error) (p any, ok bool) {
	defer func() {
		if p = recover(); p != nil {
			ok = true
		}
	}()
	_ = err.Error()
	return nil, false
}

// unwrap is errors.Unwrap for an error that may be broken: false when
// there is nothing to unwrap or its Unwrap method panics.
func unwrap(err error) (next error, ok bool) {
	defer func() {
		if recover() != nil {
			next, ok = nil, false
		}
	}()
	next = errors.Unwrap(err)
	return next, next != nil
}

// brokenError stands for a handler error whose Error method panics. It
// wraps that error, so that the class the handler marked it with still
// decides its route.
type brokenError struct {
	err error
	msg string
}

func (e *brokenError) Error() string { return e.msg }
func (e *brokenError) Unwrap() error { return e.err }
