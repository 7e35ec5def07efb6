package scope

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/commit"
)

// Transactor is implemented by a Scope that commits the input offsets
// itself, in Kafka transactions together with the records' outputs (the
// Kafka scope, package txn). The runner then consumes through a
// transactional session (the scope's ClientOptions give it its
// transactional id) and commits no offset of its own: it hands the scope
// the session and the partitions' progress ([TxnEngine]), and the scope
// decides when a transaction ends, what its offsets are, and what follows
// an abort.
//
// What the runner does for a Transactor:
//   - at most commit.MaxUndone records of a partition are dispatched and
//     not done (the rest are held), so that a partition's done records
//     above its offset fit in the offset's metadata;
//   - a poll's records that the scope says are done already (TxnSkip: their
//     outputs committed before a crash, a rebalance or an abort) are counted
//     done, not dispatched;
//   - a revoked or lost partition is not drained and nothing is committed
//     for it: its records stop (TxnGone), and its next owner redoes what
//     did not commit.
//
// What the scope does: it begins a transaction when it is handed the
// session (UseTxn) and after each one ends; its records' outputs join the
// open transaction from the key-shard workers, each followed by done(r);
// after every poll (TxnPolled) it ends the open transaction when it is
// due: it waits until no worker adds to it, commits it with, for every
// partition, TxnEngine.Progress's offset and done records, and reports it
// (TxnEngine.Committed). When it aborts, it reports that
// (TxnEngine.Aborted) and rewinds every partition to its committed state
// (TxnEngine.Rewind), so that the records not done there are delivered
// again under a new assignment. A fenced producer or a timed-out
// transaction ends Run with the scope's error.
type Transactor[R any] interface {
	Scope[R]
	// TxnConfig returns the transactional id (for messages) and the
	// transaction timeout.
	TxnConfig() (id string, timeout time.Duration)
	// UseTxn hands the scope the runner's transactional session when a
	// session starts, before any record runs; the scope begins its first
	// transaction there (an error ends Run).
	UseTxn(e TxnEngine[R]) error
	// TxnPollContext returns the context the next poll waits under,
	// derived from parent: it ends when the scope has work to do (a
	// transaction to end, a timer), or nil when that work is due now
	// (the runner then calls TxnPolled without polling). stop releases
	// it.
	TxnPollContext(parent context.Context) (ctx context.Context, stop func())
	// TxnPrepare runs before every poll waits and after every poll,
	// before its records are dispatched (the versions of newly assigned
	// partitions are restored there, so that their timers run even while
	// no record comes). An error ends Run. A prepare that rewound the
	// partitions (TxnEngine.Rewind) makes the runner drop what the poll
	// fetched: it is fetched again from the committed offsets.
	TxnPrepare(ctx context.Context) error
	// TxnPolled runs after every poll's records were dispatched: it ends
	// the open transaction when it is due, or, when stopping, ends it and
	// begins no other. An error ends the session: one that wraps
	// [ErrRenewSession] starts a new one (a new producer ID), any other
	// ends Run.
	TxnPolled(ctx context.Context, stopping bool) error
	// TxnAbort aborts the open transaction of a runner that stops on an
	// error outside a transaction's end.
	TxnAbort(ctx context.Context)
	// TxnAssigning is called with newly assigned partitions before their
	// committed offsets are fetched: their committed state is unknown
	// until then.
	TxnAssigning(ps map[string][]int32)
	// TxnGone is called with partitions whose assignment ended: revoked,
	// lost, ended by the runner, or at the stop. ended says that records
	// of them may have added to the open transaction, which therefore
	// must not commit (their offsets are no longer in it) and should end
	// soon (the session reports one revoke or loss per transaction).
	TxnGone(ps map[string][]int32, ended bool)
	// TxnSkip takes the records of one poll of a partition, in offset
	// order, and returns those to dispatch and the offsets of those its
	// committed state says are done.
	TxnSkip(topic string, partition int32, recs []*kgo.Record) (keep []*kgo.Record, done []int64)
	// TxnProgress is called when transaction markers of the input were
	// counted done on a partition with no record dispatched: there are
	// offsets to commit though no record joins the open transaction.
	TxnProgress()
}

// ErrRenewSession marks the end of a transactional session that cannot go
// on (a [Transactor]'s TxnPolled returns it, wrapped): after a transaction
// whose end failed, the producer was fenced when it was reloaded to abort
// it, or whether it committed could not be read back. The runner then
// starts a new session, as a restart would: its producer ID fences
// whatever of the old one is left, and it consumes from what the broker
// committed. A session renewed again within a minute is taken for a real
// fence, which stops the runner.
var ErrRenewSession = errors.New("kscope: a new transactional session is needed")

// TxnEngine is what the runner gives a [Transactor].
type TxnEngine[R any] interface {
	// Session is the runner's transactional session.
	Session() *kgo.GroupTransactSession
	// Progress returns, for every assigned partition whose committed
	// state prior knows (ok) and whose watermark has moved past it, the
	// state to commit now: the offset at its lowest record not done, and
	// the records done above it.
	Progress(prior func(topic string, partition int32) (d commit.Done, ok bool)) []PartitionDone
	// FlushDone hands the workers' done reports kept so far to the
	// watermarks, before Progress is read for a commit.
	FlushDone()
	// Committed reports a committed transaction that moved partitions'
	// offsets, of topics (counters, hooks, lag).
	Committed(partitions int, topics ...string)
	// Aborted counts a transaction that did not commit; a non-nil report
	// is also passed to the hooks as the commit's error, with the topics
	// whose offsets it carried.
	Aborted(partitions int, report error, topics ...string)
	// Rewind gives every assigned partition a new assignment (the work of
	// the old one is dropped, as after a revoke: its records stop, its
	// held records are dropped, its pauses lifted) and makes the consumer
	// fetch each from the offset committed returns for it (ok false: from
	// where it is).
	Rewind(committed func(topic string, partition int32) (offset int64, ok bool))
	// Schedule runs fn on the worker of key's key-shard, in order with
	// that shard's records, with a record of the partition's current
	// assignment (no offset: it is not an input record); false when the
	// partition is not assigned.
	Schedule(topic string, partition int32, key []byte, fn func(ctx context.Context, r R)) bool
	// Group is the runner's consumer group.
	Group() string
}

// PartitionDone is what a transaction commits for one partition
// ([TxnEngine].Progress).
type PartitionDone struct {
	Topic     string
	Partition int32
	Done      commit.Done
}
