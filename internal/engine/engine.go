// Package engine is what kscope's scope packages (dbscope, txn) use of the
// consumer runner beyond its public API: the interfaces a unit of work
// implements to plug into the runner, and the runner's failure routing and
// hooks. Services use the scopes' constructors; none of this is theirs to
// call.
//
// The runner (consumer.Runner) is kscope's one engine: it owns polling,
// key-shard dispatch, the in-flight bound, holding not-yet-due retry
// records, the retry loop (Failures.Rounds), the commit watermark, lag,
// stats and shutdown, for every scope. A scope is the unit of work it runs
// per batch of one key-shard: it makes each record's effect durable and
// says so with done; the runner commits offsets only up to the lowest
// record not done, every Config.CommitInterval, or, for a Transactor (the
// Kafka scope), in the Kafka transaction that carries the records'
// outputs.
package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/engine/link"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Scope turns the records of one key-shard into durable effects: the
// AtLeastOnce scope (consumer.New), the DB scope and the Kafka scope.
//
// Process receives records of one partition assignment, in offset order, and
// is never called concurrently for one shard. It calls done(r) once each
// record's effect is durable, from its own goroutine and before it returns;
// the runner commits a partition's offset only up to the lowest record not
// yet done. The runner may keep done reports to hand them to the watermark
// together (never past an offset commit); done(nil) hands over those kept
// so far at once, and a scope calls it before it waits (a backoff, a slow
// call). Process must not return while a record of a live assignment is not
// done, unless ctx is canceled (the assignment was lost, its drain timeout
// passed, or the runner stopped); records left undone are redelivered to
// the partition's next owner.
type Scope interface {
	Process(ctx context.Context, batch []*consumer.Record, done func(*consumer.Record))
}

// Batcher is implemented by a Scope that wants batches of more than one
// record: up to maxBatch records of one partition, waiting at most linger
// to fill a batch.
type Batcher interface {
	BatchLimits() (maxBatch int, linger time.Duration)
}

// Background is implemented by a Scope that has periodic work to do while
// the runner runs (an inbox cleanup, say). The runner calls RunBackground
// in a goroutine of its own when Run starts, cancels ctx when Run stops, and
// waits for it to return.
type Background interface {
	RunBackground(ctx context.Context)
}

// Delayer is implemented by a Scope that consumes delay topics: a record
// of one of them that carries a retrytopic.HeaderDue time in the future is
// held, with its partition paused, until that time; later records of the
// partition wait behind it. A handler never sleeps for it. The value is the
// longest delay records of that topic may carry: a due time further out
// (forged or corrupt) is treated as that far out, so it cannot block the
// partition. The runner consumes the delay topics besides Config.Topics.
type Delayer interface {
	DelayedTopics() map[string]time.Duration
}

// Starter is implemented by a Scope that checks what it needs before the
// runner consumes anything (its database tables, say). Run calls Start
// before it creates a Kafka client and returns its error, unless Run's
// context ended meanwhile (then Run returns nil, a clean stop).
type Starter interface {
	Start(ctx context.Context) error
}

// ClientOptioner is implemented by a Scope that needs options on the
// runner's Kafka client, such as an offset adjustment on assignment. They
// are applied after Config.ClientOptions and before kscope's own.
type ClientOptioner interface {
	ClientOptions() []kgo.Opt
}

// Transactor is implemented by a Scope whose effects commit in a Kafka
// transaction together with the input offsets (the Kafka scope). The
// runner then consumes through a transactional session (the scope's
// ClientOptions give it its transactional id) and, instead of committing
// offsets every Config.CommitInterval, ends a transaction interval after
// the first record joined it, or once maxRecords did: it waits until no
// worker is adding to it, calls TxnFlush, and commits, for every partition,
// the offset at its lowest record not done with, in the offset's metadata,
// the records done above it (at most commit.MaxUndone records of a
// partition are dispatched and not done). If the transaction aborts, it
// rewinds every partition to its committed state: the records not done
// there are delivered again, under a new assignment, and the work of the
// old one is dropped. A fenced producer or a timed-out transaction ends
// Run with txn.ErrFenced or txn.ErrTransactionTimedOut.
//
// A Transactor's Process handles each record and, once it is finished,
// joins the open transaction (Txn.Join), adds its outputs to it through
// Txn.Session, calls done(r) and leaves (Txn.Leave).
type Transactor interface {
	Scope
	// TxnConfig returns the transactional id (for messages), how long a
	// transaction collects records, the transaction timeout, and the
	// records after which a transaction ends early.
	TxnConfig() (id string, interval, timeout time.Duration, maxRecords int)
	// UseTxn hands the scope the runner's transaction control (pass t to
	// AsTxn) when Run has created the session, before any record runs.
	UseTxn(t any)
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

// Txn is what a Transactor is handed: the runner's transactional session
// and the gate of its open transaction.
type Txn interface {
	// Session is the runner's transactional session; a scope produces
	// through it, only between Join and Leave.
	Session() *kgo.GroupTransactSession
	// Join waits for an open transaction and reports whether r's effects
	// may join it: not when the runner stops or r's assignment ended.
	Join(r *consumer.Record) bool
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
	Schedule(topic string, partition int32, key []byte, fn func(ctx context.Context, r *consumer.Record)) bool
}

// AsTxn returns the Txn a Transactor is handed.
func AsTxn(t any) Txn { return t.(Txn) }

// StatsReporter is implemented by a Scope that keeps counters of its own:
// the runner's Stats calls ReportStats to fill in the scope's section
// (Stats.DB).
type StatsReporter interface {
	ReportStats(st *consumer.Stats)
}

// FailureAware is implemented by a Scope that routes failures through the
// runner's failure policy: when Run starts, the runner hands it the
// runner's failures (pass f to [AsFailures]) and makes sure the dead-letter
// topic exists.
type FailureAware interface {
	UseFailures(f any)
}

// RetryTopicUser is implemented by a FailureAware scope that sends failing
// records to the delayed retry topics (when it returns true): the runner
// then creates them if missing and consumes them too, holding each record
// until its due time.
type RetryTopicUser interface {
	UsesRetryTopics() bool
}

// Failures applies a runner's failure policy (Config.Failures): it
// classifies a handler error, decides between a retry in place, a retry
// topic, a skip and the dead-letter topic, and produces the records that
// carry a failure.
type Failures interface {
	// Class classifies err under the policy.
	Class(err error) consumer.Class
	// Decide returns what follows a failed attempt of rec, counting the
	// attempts of earlier hops (rec's headers) plus attempt, those made on
	// this hop. topics says whether the record may go to a retry topic.
	// It has no effect: Route carries the decision out.
	Decide(ctx context.Context, rec *consumer.Record, err error, attempt int, topics bool) retrytopic.Step
	// Route carries out step for rec: for a skip it logs and counts; for
	// a retry topic or the dead-letter topic it produces the record with
	// its failure metadata and waits for the broker's acknowledgement,
	// retrying with backoff until it succeeds or ctx is done.
	Route(ctx context.Context, rec *consumer.Record, err error, step retrytopic.Step, attempt int, firstFailure time.Time) error
	// Rounds is the runner's one retry loop: it calls round until a round
	// says there is no more (Round.More false) and reports whether it
	// ended with its work done (false: ctx ended, Round.Of's partition
	// was revoked, or a round said Stop). Between two rounds it calls
	// done(nil) (when done is not nil) and waits, holding the caller's
	// key-shard and nothing else: Round.Wait, or after a failed round
	// (Round.Err) a backoff that grows while rounds fail in a row, and
	// logs the failure. The DB scope runs a batch's transactions on it.
	Rounds(ctx context.Context, done func(*consumer.Record), round func() Round) bool
	// Attempts is a record's retry in place, on Rounds: it calls call
	// for rec until it succeeds or the policy decides something other
	// than a retry in place (a skip, a retry topic, the dead-letter
	// topic), which the caller carries out. Before each retry the policy
	// logs and counts it.
	Attempts(ctx context.Context, rec *consumer.Record, topics bool, done func(*consumer.Record), call func() error) Attempt
	// DeadLetterRecord and RetryTopicRecord return the record that carries
	// rec to the dead-letter topic or to step's retry topic, for a scope
	// that produces it itself (the Kafka scope, in its transaction).
	DeadLetterRecord(rec *consumer.Record, err error, step retrytopic.Step, attempt int, firstFailure time.Time) *kgo.Record
	RetryTopicRecord(rec *consumer.Record, err error, step retrytopic.Step, attempt int, firstFailure time.Time) *kgo.Record
	// Metadata returns the failure metadata rec carries (on its first hop,
	// its own coordinates and identity).
	Metadata(rec *consumer.Record) retrytopic.Metadata
	// MetadataOf is Metadata for a record whose identity (id) the caller
	// has already computed.
	MetadataOf(rec *consumer.Record, id string) retrytopic.Metadata
	// Policy returns the failure policy, with its defaults.
	Policy() retrytopic.Policy
	// PanicStack returns the log attribute that carries the stack of the
	// handler panic err holds (guard.PanicError), the first time it is
	// asked for rec (by identity); nil after that, and when err holds no
	// panic. Route adds it to its lines; a scope that logs a record's
	// failure itself (the Kafka scope's retry and dead-letter lines) adds
	// it to its own, so that a panic's stack is logged once per record.
	PanicStack(rec *consumer.Record, err error) []slog.Attr
}

// Observer dispatches a runner's hooks (Config.Hooks); every method is a
// no-op, and allocation-free, when no hook implements its interface.
type Observer interface {
	// Start begins a delivery of r (hook.RecordHook) and returns the context the
	// hooks returned; Context returns it again later.
	Start(ctx context.Context, r *consumer.Record) context.Context
	Context(ctx context.Context, r *consumer.Record) context.Context
	// End ends r's delivery with out, once; Ended reports whether it ended.
	End(r *consumer.Record, out hook.Outcome, err error)
	Ended(r *consumer.Record) bool
	Event(r *consumer.Record, ev hook.Event, detail string)
	Inject(ctx context.Context, out *kgo.Record)
	Route(r hook.Route)
	Commit(partitions int, err error)
	Rebalance(kind string, partitions int)
	Fetched(topic string, partition int32, n int)
	Lag(l hook.Lag)
	Gone(topic string, partition int32)
	Lateness(topic string, late time.Duration)
	WantsFetch() bool
	WantsLag() bool
}

// Attempt is how a record's attempts on one hop ended (Failures.Attempts).
type Attempt = link.Attempt

// Round is what one round of a scope's work did (Failures.Rounds): whether
// there is a next round, the record it starts with (Of: its partition's
// revocation stops the loop), the wait before it (Wait: a retry in place's
// delay), and whether this round failed (Err, and Progress when some of
// its records were done first; a failed round is logged and backs off;
// Held when its error says the deployment is wrong, not the record: the
// key-shard is then reported as holding, in Stats.Hold and to
// hook.HoldHook, until a round of the loop succeeds or the loop ends) or
// left records undone (Stop: the loop ends).
type Round = link.Round[*consumer.Record]

// NewRunner returns a runner for scope s, with cfg's defaults filled in.
func NewRunner(cfg consumer.Config, s Scope) (*consumer.Runner, error) {
	return link.NewRunner.(func(consumer.Config, any) (*consumer.Runner, error))(cfg, s)
}

// CheckConfig returns cfg with its defaults filled in, and the error every
// runner's constructor returns for it (nil when it is valid).
func CheckConfig(cfg consumer.Config) (consumer.Config, error) {
	return link.CheckConfig.(func(consumer.Config) (consumer.Config, error))(cfg)
}

// AsFailures returns the failures a FailureAware scope is handed.
func AsFailures(f any) Failures { return f.(Failures) }

// NewObserver returns the Observer of group's hooks.
func NewObserver(group string, hooks []hook.Hook) Observer {
	return link.NewObserver.(func(string, []hook.Hook) any)(group, hooks).(Observer)
}

// ObserverOf returns the Observer that f reports through.
func ObserverOf(f Failures) Observer {
	return link.ObserverOf.(func(any) any)(f).(Observer)
}

// DueOf reads the due time a delay-topic record carries (ok is false when
// it carries none or an unreadable one: it is due now). A due time up to
// twice maxDelay ahead is clamped to now+maxDelay; one further out is due
// now, so a forged or corrupt time cannot block a partition.
func DueOf(rec *consumer.Record, now time.Time, maxDelay time.Duration) (time.Time, bool) {
	return link.DueOf.(func(*consumer.Record, time.Time, time.Duration) (time.Time, bool))(rec, now, maxDelay)
}

// OutcomeOf returns the outcome of a delivery whose failure ended in step
// action a: skipped, retried (a retry topic) or dead-lettered.
func OutcomeOf(a retrytopic.Action) hook.Outcome {
	return link.OutcomeOf.(func(retrytopic.Action) hook.Outcome)(a)
}

// ShardOf returns the key-shard r was routed to.
func ShardOf(r *consumer.Record) int { return link.ShardOf.(func(*consumer.Record) int)(r) }

// RevokedCh returns a channel that is closed when r's partition is revoked
// from (or lost by) this member, for a scope that waits between attempts of
// r: a revoke or a shutdown then does not wait for the backoff. A record
// not consumed by a runner has none (nil).
func RevokedCh(r *consumer.Record) <-chan struct{} {
	return link.RevokedCh.(func(*consumer.Record) <-chan struct{})(r)
}

// Handling tells the runner's stall watch (consumer.Config.StallWarning)
// that r's handler runs now, and Handled that it returned. A scope that
// reports its records done only once their batch's transaction commits
// calls them around each handler call, so that a stall names the record
// whose handler has not returned; a scope that reports each record done
// as it handles it needs neither.
func Handling(r *consumer.Record) { link.Handling.(func(*consumer.Record))(r) }

// Handled tells the stall watch that the handler Handling named returned.
func Handled(r *consumer.Record) { link.Handled.(func(*consumer.Record))(r) }
