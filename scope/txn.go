package scope

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Transactor is implemented by a Scope whose effects commit in a Kafka
// transaction together with the input offsets (the Kafka scope, package
// txn). The runner then consumes through a transactional session (the
// scope's ClientOptions give it its transactional id) and, instead of
// committing offsets every consumer.Config.CommitInterval, ends a
// transaction interval after the first record joined it, or once
// maxRecords did: it waits until no worker is adding to it, calls
// TxnFlush, and commits, for every partition, the offset at its lowest
// record not done with, in the offset's metadata, the records done above
// it (at most commit.MaxUndone records of a partition are dispatched and
// not done). If the transaction aborts, it rewinds every partition to its
// committed state: the records not done there are delivered again, under
// a new assignment, and the work of the old one is dropped. A fenced
// producer or a timed-out transaction ends Run with txn.ErrFenced or
// txn.ErrTransactionTimedOut.
//
// A Transactor's Process handles each record and, once it is finished,
// joins the open transaction ([Txn].Join), adds its outputs to it through
// [Txn].Session, calls done(r) and leaves ([Txn].Leave). The runner
// commits no transaction while a worker is between Join and Leave.
type Transactor[R any] interface {
	Scope[R]
	// TxnConfig returns the transactional id (for messages), how long a
	// transaction collects records, the transaction timeout, and the
	// records after which a transaction ends early.
	TxnConfig() (id string, interval, timeout time.Duration, maxRecords int)
	// UseTxn hands the scope the runner's transaction control when Run
	// has created the session, before any record runs.
	UseTxn(t Txn[R])
	// TxnFlush is called once no worker is adding to the transaction
	// that ends: it waits for the transaction's produces and returns the
	// first that failed (the transaction then aborts).
	TxnFlush() error
	// TxnEnded is called after the transaction committed or aborted.
	TxnEnded(committed bool)
	// TxnAssigned is called with newly assigned partitions once their
	// committed offsets were fetched (no transaction of a previous owner
	// is pending on them any more); TxnGone with revoked or lost ones.
	TxnAssigned(ps map[string][]int32)
	TxnGone(ps map[string][]int32)
	// TxnPrepare runs before every poll waits and after every poll,
	// before its records are dispatched (the versions of newly assigned
	// partitions are restored there, so that their timers run even while
	// no record comes). An error ends Run.
	TxnPrepare(ctx context.Context) error
	// TxnTick runs before every poll: it does the scope's work that is
	// due at now and returns when more is (zero for never); the poll
	// ends then, or at Txn.Kick.
	TxnTick(now time.Time) time.Time
}

// Txn is what a [Transactor] is handed: the runner's transactional session
// and the gate of its open transaction.
type Txn[R any] interface {
	// Session is the runner's transactional session; a scope produces
	// through it, only between Join and Leave.
	Session() *kgo.GroupTransactSession
	// Join waits for an open transaction and reports whether r's effects
	// may join it: not when the runner stops or r's assignment ended.
	Join(r R) bool
	// Leave ends a Join; input says whether it added an input record.
	Leave(input bool)
	// Kick wakes the poll loop, so that TxnTick runs again.
	Kick()
	// End ends the open transaction now; from TxnPrepare only.
	End() error
	// Schedule runs fn on the worker of key's key-shard, in order with
	// that shard's records, with a record of the partition's current
	// assignment (no offset: it is not an input record); false when the
	// partition is not assigned.
	Schedule(topic string, partition int32, key []byte, fn func(ctx context.Context, r R)) bool
}
