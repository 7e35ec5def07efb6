package consumer

import "github.com/kscope-dev/kscope/retrytopic"

// Class is how a handler's error is treated; see retrytopic.Class.
type Class = retrytopic.Class

// The classes of a handler error.
const (
	ClassUnknown   = retrytopic.ClassUnknown
	ClassRetryable = retrytopic.ClassRetryable
	ClassTerminal  = retrytopic.ClassTerminal
	ClassSkip      = retrytopic.ClassSkip
)

// Skip marks a business rejection (a declined card): the record is
// acknowledged and counted as skipped, not retried and not dead-lettered.
func Skip(reason error) error { return retrytopic.Skip(reason) }

// Terminal marks a failure that retrying cannot fix: the record goes to the
// dead-letter topic at once.
func Terminal(err error) error { return retrytopic.Terminal(err) }

// Retryable marks a transient failure: the record is retried with the full
// budget.
func Retryable(err error) error { return retrytopic.Retryable(err) }

// DecodeError marks a record that could not be decoded or failed
// validation: it is poison and goes to the dead-letter topic at once.
func DecodeError(err error) error { return retrytopic.DecodeError(err) }

// ClassOf returns the class an error was marked with, or ClassUnknown.
func ClassOf(err error) Class { return retrytopic.ClassOf(err) }
