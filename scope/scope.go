package scope

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Scope turns the records of one key-shard into durable effects.
//
// Process receives records of one partition assignment, in offset order,
// and is never called concurrently for one key-shard. It calls done(r) once
// r's effect is durable, from its own goroutine and before it returns; the
// runner commits a partition's offset only up to the lowest record not yet
// done. The runner may keep done reports to hand them to the watermark
// together (never past an offset commit); done(nil) hands over those kept
// so far at once, and a scope calls it before it waits (a backoff, a slow
// call). Process must not return while a record of a live assignment is
// not done, unless ctx is canceled (the assignment was lost, its drain
// timeout passed, or the runner stopped); records left undone are
// redelivered to the partition's next owner, so an effect made durable
// without done must be one the scope recognises when the record comes
// again (an inbox row, say).
type Scope[R any] interface {
	Process(ctx context.Context, batch []R, done func(R))
}

// Batcher is implemented by a Scope that wants batches of more than one
// record: up to maxBatch records of one partition, waiting at most linger
// to fill a batch.
type Batcher interface {
	BatchLimits() (maxBatch int, linger time.Duration)
}

// Background is implemented by a Scope that has periodic work to do while
// the runner runs (an inbox cleanup, say). The runner calls RunBackground
// in a goroutine of its own when a session starts, cancels ctx when it
// ends, and waits for it to return.
type Background interface {
	RunBackground(ctx context.Context)
}

// Delayer is implemented by a Scope that consumes delay topics: a record
// of one of them that carries a retrytopic.HeaderDue time in the future is
// held, with its partition paused, until that time; later records of the
// partition wait behind it. A handler never sleeps for it. The value is
// the longest delay records of that topic may carry: a due time further
// out (forged or corrupt) is treated as that far out, so it cannot block
// the partition. The runner consumes the delay topics besides
// consumer.Config.Topics.
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
// are applied after consumer.Config.ClientOptions and before kscope's own.
type ClientOptioner interface {
	ClientOptions() []kgo.Opt
}

// ClientDefaulter is implemented by a Scope with defaults of its own for
// the runner's Kafka client, such as a producer linger suited to how it
// produces. They are applied before consumer.Config.ClientOptions, which
// override them.
type ClientDefaulter interface {
	ClientDefaults() []kgo.Opt
}

// StatsReporter is implemented by a Scope that keeps counters of its own:
// the runner's Stats calls ReportStats to fill in the scope's section
// (consumer.Stats.DB).
type StatsReporter[S any] interface {
	ReportStats(st *S)
}

// EngineUser is implemented by a Scope that uses what the runner offers
// beyond done: its failure policy, its hooks, a record's key-shard, its
// stall watch ([Engine]). The runner hands it the engine each time a
// session starts, before any record is dispatched, and makes sure the
// dead-letter topic exists.
type EngineUser[R any] interface {
	UseEngine(e Engine[R])
}

// RetryTopicUser is implemented by an [EngineUser] that sends failing
// records to the delayed retry topics (when it returns true): the runner
// then creates them if missing and consumes them too, holding each record
// until its due time.
type RetryTopicUser interface {
	UsesRetryTopics() bool
}

// KeyHolder is implemented by a scope that supports
// consumer.Config.KeyBreaker, the circuit breaker of each key; the runner
// refuses that setting for a scope without it. KeyHolds says who keeps the
// records of a held key.
type KeyHolder interface {
	KeyHolds() KeyHold
}

// KeyHold says who keeps the records of a key its circuit breaker holds
// ([KeyHolder]).
type KeyHold int

const (
	// HoldInMemory: the runner keeps them, in memory, counted against its
	// in-flight bounds. Failures.Attempts returns Attempt.Held for a
	// record whose key is held (the one whose failure opened the breaker
	// too, and every later one of its key, turned away by Engine.Call
	// before its handler); the scope ends its delivery and goes on, and
	// the runner gives the key's records back to the scope's Process, in
	// order, on their key-shard, once the key's cool-down passed: the
	// first as its probe, the rest once the probe succeeded. A record of a
	// partition revoked meanwhile is dropped, for its next owner.
	HoldInMemory KeyHold = iota + 1
	// HoldInScope: the scope keeps them itself, in its own store (the DB
	// scope parks them in PostgreSQL). Failures.Decide returns
	// retrytopic.ActionHold for the failure that holds a key, with the
	// cool-down as Step.Delay; the scope stores the record and every
	// later record of its key, reports them done once stored, and after
	// the cool-down runs the first as the key's probe (Failures.KeyProbe
	// marks it) and, once it succeeded, the rest in order.
	HoldInScope
)

// Periodic is implemented by a Scope that has work of its own to do on
// every partition of the service's topics assigned to the member (not
// kscope's retry or delay topics), every so often: the DB scope
// runs dbscope.Options.Periodic in a transaction. A scope without it (or
// whose PeriodicInterval is 0) runs consumer.Config.Periodic's plain
// function, if any; the runner refuses both at once.
//
// Every PeriodicInterval while a partition is assigned to the member
// (the first one PeriodicInterval after its assignment), the runner calls
// RunPeriodic for it on one of the partition's key-shard workers, in
// order with that key-shard's records, under the partition's assignment:
// never two calls for one partition at once, and never after the
// partition's revoke or the runner's stop began. A revoke and a stop wait
// for a running call as they wait for a running record (up to
// consumer.Config.DrainTimeout, then ctx is canceled); a [Transactor]'s
// revoke cancels it at once, as it stops its records. An error is logged
// and counted (consumer.Stats.Periodic), and the work runs again at the
// next interval; a panic is an error ([Call]).
type Periodic interface {
	// PeriodicInterval returns how often RunPeriodic runs for each
	// assigned partition; 0: the scope has no periodic work.
	PeriodicInterval() time.Duration
	// RunPeriodic does the work for one partition.
	RunPeriodic(ctx context.Context, topic string, partition int32) error
}
