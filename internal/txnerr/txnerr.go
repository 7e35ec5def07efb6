// Package txnerr holds the errors a transactional runner returns, shared by
// the runner (package consumer), which raises them, and package txn, which
// exports them.
package txnerr

import "errors"

// ErrFenced, ErrTimedOut and ErrUnwritable are txn.ErrFenced,
// txn.ErrTransactionTimedOut and txn.ErrUnwritable.
var (
	ErrFenced     = errors.New("kscope: fenced")
	ErrTimedOut   = errors.New("kscope: transaction timed out")
	ErrUnwritable = errors.New("kscope: records the broker refuses")
)
