// Package txn is kscope's Kafka scope: exactly-once Kafka-to-Kafka
// pipelines. A handler reads a record and emits output records; the outputs
// and the input offsets commit in one Kafka transaction, so a read_committed
// reader downstream sees every input's outputs exactly once, whatever
// crashes, rebalances or broker faults happen.
//
// # How
//
// The Kafka scope is a unit of work on kscope's one runner (the engine of
// package consumer), a scope.Transactor: the runner consumes through a
// franz-go GroupTransactSession, polls and hands the records to the
// key-shard workers (per-key order, parallelism across keys). A worker runs
// a record's handler and, once the record is finished, adds its outputs
// (or its route) to the open transaction. The scope ends the transaction
// Options.CommitInterval after the first record joined it, or once
// Options.MaxRecords did, and commits, with the outputs, each partition's
// offset at its lowest unfinished record. A rebalance or a fenced
// producer during a transaction aborts it, and the runner rewinds every
// partition to its last committed state: the aborted outputs are never
// visible to read_committed readers.
//
// A record retrying in place waits between its attempts outside any
// transaction: it holds its key-shard (the later records of its key, and
// of the keys that share the shard, wait behind it) and nothing else.
// Records after it in its partition keep committing, so the offset of
// that partition stays at the retrying record; the offset's metadata
// records, atomically with it, which records above it are finished (at
// most 256 are not: past that the partition's records wait). A member
// that gets the partition, after a crash or a rebalance, skips those, so
// their outputs are never produced twice.
//
// Failures are routed by consumer.Config.Failures inside the transaction: a
// record is retried in place with backoff, skipped, or its dead-letter
// record is produced in the same transaction, so a crash never leaves a
// record both dead-lettered and processed, or lost. With an Unordered
// policy, a record that keeps failing goes to the delayed retry topics
// instead, also inside the transaction; the runner consumes them and holds
// each record until its due time without committing past it (the
// partition is paused meanwhile), as in every scope. Keyed
// records keep per-key order by default, so they retry in place: there is
// no store to park a key's later records in, as the DB scope has.
//
// # Versions
//
// With Options.Versions, the scope checks per-key versions as package
// sequence describes, with no store outside Kafka: the last applied
// version of every key, and the records parked behind a gap, live in a
// compacted changelog topic per input topic ([VersionsTopic]), written in
// the same transaction as the outputs. Its partition p holds the keys of
// the input's partition p, so the member that owns a partition owns its
// versions, keeps them in memory, and restores them from the changelog
// (read_committed) when the partition is assigned to it, the way Kafka
// Streams restores a state store. A record ahead of its key's next version
// is parked in the changelog (Wait) and applied, in the transaction that
// applies the version before it; one that waits past GapTimeout goes to
// the dead-letter topic with the expected and actual versions. A parked
// record delivered again (the same source record, or the same identity:
// a producer's retry, a replay) stays parked as it was. Another record of
// the key with the same version (another identity: a producer that sent
// the version twice) waits with it, in its changelog record, and ends as
// it would behind a parked head in the DB scope: when the version before
// them is applied, the first of them that is applied (or skipped) applies
// the version and the others are stale, one the handler dead-letters
// leaving the version to the next; past GapTimeout they go to the
// dead-letter topic together. A parked
// record's input offset is committed: a runner without Versions, which
// would leave it in the changelog, refuses to start while one waits there
// (Run returns a *consumer.ConfigError on Versions).
//
// # The transactional id
//
// Every member of the group needs a transactional id of its own that stays
// the same when the member restarts: Options.TransactionalID, by default
// "<group>-<hostname>" (a StatefulSet pod name, say). A restarted member
// initialises its producer ID before it polls: it fences its previous
// incarnation at once and aborts its open transaction, instead of leaving
// read_committed readers, and itself, waiting for the transaction
// timeout. Two live members with the same id fence each other:
// the older one's Run returns an error. Zombies from an older group
// generation are fenced by the group metadata sent with the offsets
// (KIP-447), so ids need not follow partitions.
//
// # What the Kafka scope does not cover
//
// Readers of the outputs must read with isolation.level=read_committed
// (kscope's own runners do by default); a read_uncommitted reader sees
// aborted outputs. Side effects outside Kafka (a database write, an HTTP
// call) are at-least-once: a transaction that aborts runs its handlers
// again. State kept in memory per key (versions, parked records) is bounded
// by the number of keys of the owned partitions.
package txn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/ratelog"
	"github.com/kscope-dev/kscope/sequence"
)

// Emitter collects a handler's output records. They are produced, inside the
// input's transaction, only if the handler returns nil.
type Emitter interface {
	Emit(r *kgo.Record)
}

// Handler transforms one input record into output records.
type Handler interface {
	Handle(ctx context.Context, r *consumer.Record, out Emitter) error
}

// HandlerFunc adapts a function to [Handler].
type HandlerFunc func(ctx context.Context, r *consumer.Record, out Emitter) error

// Handle calls f(ctx, r, out).
func (f HandlerFunc) Handle(ctx context.Context, r *consumer.Record, out Emitter) error {
	return f(ctx, r, out)
}

// Defaults applied to Options fields left at zero.
const (
	DefaultCommitInterval     = 100 * time.Millisecond
	DefaultMaxRecords         = 10_000
	DefaultTransactionTimeout = 2 * time.Minute
)

// Options configure the Kafka scope.
type Options struct {
	// TransactionalID identifies this member's producer; see the package
	// documentation. Default "<group>-<hostname>".
	TransactionalID string

	// CommitInterval bounds how long one transaction collects polled
	// records before it ends: shorter means lower end-to-end latency (a
	// read_committed reader sees outputs only after the commit), longer
	// means fewer, larger transactions and more throughput. Default 100ms.
	CommitInterval time.Duration

	// MaxRecords bounds the input records of one transaction: it ends
	// early once that many joined it. Default 10,000. (The records polled
	// and waiting for a worker are bounded by Config.MaxInFlightRecords
	// and MaxInFlightBytes, as in every scope.)
	MaxRecords int

	// TransactionTimeout is how long the broker lets a transaction stay
	// open before aborting it (and fencing the producer: Run then returns
	// an error that says the transaction timed out). A transaction is
	// open for CommitInterval plus the time to produce and commit; a
	// handler's run and its in-place retries happen outside it, so this
	// need not cover them. Default 2m. Java: transaction.timeout.ms.
	TransactionTimeout time.Duration

	// Versions, when not nil, turns on version-gap detection with a
	// changelog topic per input (see the package documentation). Null-key
	// records are not versioned. Versions need per-key order, so they do
	// not combine with an Unordered failure policy. Removing it once set:
	// Run fails while records parked behind a gap wait in a changelog
	// (see the package documentation). Versions are kept per input
	// partition: partitions added to an input topic move keys, and a
	// moved key's first record in its new partition is checked as a new
	// key's (sequence.First). Turned off and on again, keys written in
	// between find gaps; see sequence.Accept for the first run back. A
	// record with the version of a parked record of its key is kept with
	// it unless it is that record delivered again (see the package
	// documentation).
	Versions *sequence.Config

	// FillGap, when set with Versions, rebuilds a key's state for the
	// versions an input skipped: called for an input found past a gap,
	// before its handler, whatever the Gaps policy; what it emits (a
	// snapshot of the key's state, say) joins the transaction with the
	// handler's outputs, or is dropped with them. On nil the handler runs
	// (sequence.FromContext reports the gap), the input's version becomes
	// the key's last and the gap counts as filled (KafkaStats.GapsFilled).
	// An error fails the input as its handler's would.
	FillGap func(ctx context.Context, r *consumer.Record, gap sequence.Result, out Emitter) error

	// Dedupe, when not nil, turns on the idempotency guard: an input whose
	// identity an earlier input of its partition succeeded with produces
	// no output (see DedupeOptions). With Versions it is not needed (a
	// duplicate carries its original's version and is skipped as stale)
	// and New refuses both at once.
	Dedupe *DedupeOptions
}

func (o Options) withDefaults(group string) Options {
	if o.TransactionalID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "localhost"
		}
		o.TransactionalID = group + "-" + host
	}
	if o.CommitInterval == 0 {
		o.CommitInterval = DefaultCommitInterval
	}
	if o.MaxRecords == 0 {
		o.MaxRecords = DefaultMaxRecords
	}
	if o.TransactionTimeout == 0 {
		o.TransactionTimeout = DefaultTransactionTimeout
	}
	if o.Versions != nil {
		v := o.Versions.WithDefaults()
		o.Versions = &v
	}
	if o.Dedupe != nil {
		d := o.Dedupe.withDefaults()
		o.Dedupe = &d
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &consumer.ConfigError{Struct: "txn.Options", Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	if o.CommitInterval < 0 {
		bad("CommitInterval", "is %s; set a positive duration (0 selects %s)", o.CommitInterval, DefaultCommitInterval)
	}
	if o.MaxRecords < 0 {
		bad("MaxRecords", "is %d; set a positive count (0 selects %d)", o.MaxRecords, DefaultMaxRecords)
	}
	if o.TransactionTimeout < 0 || (o.TransactionTimeout > 0 && o.TransactionTimeout <= o.CommitInterval) {
		bad("TransactionTimeout", "is %s; it must be longer than CommitInterval (%s)", o.TransactionTimeout, o.CommitInterval)
	}
	if o.FillGap != nil && o.Versions == nil {
		bad("FillGap", "is set without Versions, which find the gaps it fills; set Versions too, or leave FillGap nil")
	}
	if o.Dedupe != nil {
		o.Dedupe.validate(bad)
		if o.Versions != nil {
			bad("Dedupe", "is set with Versions, which skip a duplicate as stale already (it carries its original's version); unset Dedupe")
		}
	}
	if o.Versions != nil {
		if err := o.Versions.Validate(); err != nil {
			bad("Versions", "%v", err)
		}
	}
	return errors.Join(errs...)
}

// Runner runs a Kafka-scope pipeline: the runner of package consumer with
// the Kafka scope as its unit of work. Build it with [New], Run it, Close
// it. Run returns [ErrFenced], [ErrTransactionTimedOut] or [ErrUnwritable]
// (wrapped with the details) when the runner cannot go on, and the broker's
// authorization error (test it with errors.Is, e.g. against
// kerr.TopicAuthorizationFailed) when the broker refuses a write of a
// transaction: an output, a retry or dead-letter record, or the version
// changelog. That transaction was aborted; its records are consumed again
// once a runner may write. When ending a transaction fails and its outcome
// cannot be read back, or the producer is fenced by its own reload after
// that failure (Apache Kafka does so after its transaction coordinator
// failed over), Run starts a new session (client, producer ID, group
// membership) and goes on from what the broker committed; a second one
// within a minute returns an error instead.
//
// An output the broker can never take (too large, an invalid record or
// topic name) fails the input that emitted it, as Terminal (the failure
// policy then dead-letters it, with the reason): an output larger than
// the producer writes (kgo.ProducerBatchMaxBytes) before it is produced,
// one the broker refuses once its transaction aborted, on the input's
// redelivery. A record waiting for a version gap whose changelog record
// is that large is dead-lettered at once.
type Runner struct {
	*consumer.Runner
	s *kafkaScope
}

// New returns a Kafka-scope runner. cfg is the consumer configuration:
// Brokers, Group, Topics, ClientOptions (before kscope's own, as in every
// scope), Shards, NullKeys, MaxInFlightRecords, MaxInFlightBytes,
// RebalanceTimeout, Logger, Identity, Failures and Hooks apply;
// CommitInterval does not (Options.CommitInterval ends the transactions,
// which commit the offsets), nor does DrainTimeout's drain: at a stop or
// a rebalance the open transaction ends at once, and a record still
// running is redone by its partition's next owner.
func New(cfg consumer.Config, o Options, h Handler) (*Runner, error) {
	var errs []error
	if h == nil {
		errs = append(errs, &consumer.ConfigError{Struct: "txn.New's handler", Reason: "is nil; pass the function that turns each input into outputs"})
	}
	o = o.withDefaults(cfg.Group)
	errs = append(errs, o.validate())
	if o.Versions != nil && cfg.Failures.Unordered {
		errs = append(errs, &consumer.ConfigError{Struct: "txn.Options", Field: "Versions",
			Reason: "is set with Config.Failures.Unordered; versions are applied in per-key order, so unset one of them"})
	}
	if o.Versions != nil && cfg.KeyBreaker != nil {
		errs = append(errs, &consumer.ConfigError{Struct: "txn.Options", Field: "Versions",
			Reason: "is set with Config.KeyBreaker, which the Kafka scope does not run with versions (a held key's later records would be version gaps); unset one of them, or use the DB scope, which runs both"})
	}
	s := &kafkaScope{o: o, h: h, dltLog: ratelog.New(10, 10*time.Second)}
	s.init(cfg.WithDefaults()) // NewScoped reports the config's errors
	r, err := consumer.NewScoped(cfg, s)
	if err := errors.Join(append(errs, err, consumer.CheckRoutes(cfg, h))...); err != nil {
		return nil, err
	}
	return &Runner{Runner: r, s: s}, nil
}

// emitter buffers one record's outputs.
type emitter struct{ out []*kgo.Record }

func (e *emitter) Emit(r *kgo.Record) { e.out = append(e.out, r) }
