package retrytopic

import (
	"errors"
	"fmt"
)

// Class is how a handler's error is treated. Handlers return plain errors
// or wrap them with [Skip], [Terminal] or [Retryable] (also available as
// consumer.Skip and so on); Policy.Classify may override.
type Class int

const (
	// ClassUnknown is an error with no class: retried, with the smaller
	// "unknown" budget, then dead-lettered.
	ClassUnknown Class = iota
	// ClassRetryable is a transient failure (a dependency down, a 503):
	// retried in place, then through the retry topics, then dead-lettered.
	ClassRetryable
	// ClassTerminal is a failure no retry can fix (a poison record, a
	// payload that cannot be decoded or fails validation): dead-lettered at
	// once.
	ClassTerminal
	// ClassSkip is a business outcome, not a failure (a declined card): the
	// record is acknowledged, counted and logged, and not retried.
	ClassSkip
)

// String returns the class name used in headers, logs and metrics.
func (c Class) String() string {
	switch c {
	case ClassUnknown:
		return "unknown"
	case ClassRetryable:
		return "retryable"
	case ClassTerminal:
		return "terminal"
	case ClassSkip:
		return "skip"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// ParseClass is the inverse of Class.String.
func ParseClass(s string) (Class, bool) {
	for _, c := range []Class{ClassUnknown, ClassRetryable, ClassTerminal, ClassSkip} {
		if c.String() == s {
			return c, true
		}
	}
	return ClassUnknown, false
}

type classified struct {
	class Class
	err   error
}

func (c *classified) Error() string {
	if c.err == nil {
		return c.class.String()
	}
	return c.err.Error()
}
func (c *classified) Unwrap() error { return c.err }

// Skip marks a business rejection: the record is acknowledged and counted as
// skipped, not retried and not dead-lettered. reason is logged.
func Skip(reason error) error { return &classified{ClassSkip, reason} }

// Terminal marks a failure that retrying cannot fix: the record goes to the
// dead-letter topic at once.
func Terminal(err error) error { return &classified{ClassTerminal, err} }

// Retryable marks a transient failure: the record is retried, in place and
// through the retry topics, with the full budget.
func Retryable(err error) error { return &classified{ClassRetryable, err} }

// DecodeError marks a record that could not be decoded or failed
// validation. It is terminal: such a record is poison. err is wrapped in a
// [DecodeFailure] unless its chain already holds one (a codec's), so the
// dead-letter record carries the decode headers.
func DecodeError(err error) error {
	if decodeFailure(err) != nil {
		return Terminal(err)
	}
	return Terminal(&DecodeFailure{Err: err})
}

// ClassOf returns the class an error was marked with (the outermost mark
// wins), ClassTerminal for an unmarked [DecodeFailure], or ClassUnknown. A
// nil error has no class: callers check for nil first.
func ClassOf(err error) Class {
	var c *classified
	if errors.As(err, &c) {
		return c.class
	}
	if decodeFailure(err) != nil {
		return ClassTerminal
	}
	return ClassUnknown
}
