// Package guard runs a user's handler so that a panic in it becomes an
// error: one bad record must not take the process down with every other
// key-shard's work. Every scope calls its handlers through it.
package guard

import (
	"fmt"
	"runtime/debug"
)

// Call runs fn and returns its error, or an error that carries the panic's
// value and stack when fn panicked.
func Call(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("kscope: handler panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return fn()
}
