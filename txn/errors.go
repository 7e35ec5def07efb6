package txn

import "github.com/kscope-dev/kscope/internal/txnerr"

// Errors Run returns when the runner cannot go on. Each is wrapped with the
// details (the transactional id, how long the transaction was open) and the
// broker's error; test for them with errors.Is.
var (
	// ErrFenced: another producer initialized this runner's transactional
	// id (a second instance with the same Options.TransactionalID, or this
	// instance's successor after a pause), so nothing this runner produces
	// can commit any more. Its open transaction was aborted; the successor
	// redoes that work. Give every member its own TransactionalID.
	ErrFenced = txnerr.ErrFenced
	// ErrTransactionTimedOut: a transaction stayed open longer than
	// Options.TransactionTimeout, so the broker aborted it and fenced the
	// producer. Its records are consumed again by the next owner. Raise
	// the timeout or find what made producing or committing slow.
	ErrTransactionTimedOut = txnerr.ErrTimedOut
	// ErrUnwritable: the broker refused records as such (too large, or
	// invalid) where failing their input cannot help: a dead-letter
	// record, or the records of several inputs together, in
	// several transactions in a row. Nothing of those transactions
	// committed; the records are consumed again once the topic's limits
	// or the handler are fixed.
	ErrUnwritable = txnerr.ErrUnwritable
)
