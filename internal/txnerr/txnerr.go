// Package txnerr holds the errors a transactional runner returns, shared by
// the runner (package consumer), which raises them, and package txn, which
// exports them.
package txnerr

import "errors"

// ErrFenced and ErrTimedOut are txn.ErrFenced and txn.ErrTransactionTimedOut.
var (
	ErrFenced   = errors.New("kscope: fenced")
	ErrTimedOut = errors.New("kscope: transaction timed out")
)
