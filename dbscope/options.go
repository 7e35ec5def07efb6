package dbscope

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/sequence"
)

// Handler applies one record's effect inside tx, the transaction that also
// holds the record's inbox row. A nil error means the effect may commit.
// The handler must do its database work through tx only, and must not
// commit or roll it back: tx refuses Commit and Rollback, and a statement
// that would end the transaction (COMMIT, END, ABORT, ROLLBACK but for
// ROLLBACK TO a savepoint of its own, PREPARE TRANSACTION; in a script
// such as "BEGIN; ...; COMMIT" too) is not sent, and fails the record as
// terminal: the transaction holds the other records of the batch. tx takes a savepoint before the
// record's first statement (in the same round trip when that statement is
// an Exec with arguments), so a failing record's writes roll back alone.
//
// A statement that fails leaves the transaction aborted: return its error.
// A handler that goes on after it (returns nil, or a consumer.Skip) has
// its writes rolled back to its savepoint; a nil is then a failure of the
// record, routed by the failure policy, and a skip stays a skip but
// without its writes (the error passed to the hooks says so). To go on
// after a statement that may fail, run it in a nested transaction
// (tx.Begin) and roll that back. A write that breaks a deferred constraint
// (DEFERRABLE INITIALLY DEFERRED) is refused only at COMMIT: the record
// whose writes broke it fails with the constraint's error, as if its
// statement had failed, and the other records of its batch commit.
//
// The handler runs more than once for one delivery of a record only when:
//   - the record failed: the handler returned an error (other than a
//     skip), panicked, or left the transaction aborted, and the failure
//     policy retries it (in place, or from a retry topic);
//   - a transient database error raised by its own statements (a statement
//     timeout, a deadlock, a serialization failure) rolled it back: the
//     records before it commit, and it runs again after a backoff;
//   - its transaction did not commit after it ran: the connection was
//     lost, the server restarted, COMMIT failed, or the process stopped or
//     lost the partition first (the next owner runs it);
//   - a record after it in its transaction sent a first statement that
//     PostgreSQL could not prepare (a table that does not exist, a syntax
//     error), which aborts the transaction before that record's savepoint,
//     or a record of its transaction broke a deferred constraint: the
//     transaction runs again, that record failing with PostgreSQL's error
//     without its handler being called (or, for an error of
//     [IsDeploymentError] that no class claims, over the records before
//     it, that record waiting for the deployment to be fixed);
//   - a statement of its own, or of a record before it, met an error of
//     [IsDeploymentError] (a missing table or column, a refused
//     privilege): its key-shard holds and runs it again, with backoff,
//     until the statement succeeds (see [New]).
//
// Any other failure of another record in its batch never makes it run
// again. Only the call whose transaction commits leaves effects in the
// database.
// Effects outside the database — an HTTP call, an email — happen once per
// call: give them an idempotency key (the record's identity is a good
// one).
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, r *consumer.Record) error
}

// HandlerFunc adapts a function to [Handler].
type HandlerFunc func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error

// Handle calls f(ctx, tx, r).
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
	return f(ctx, tx, r)
}

// Defaults applied to Options fields left at their zero value.
const (
	DefaultBatchSize       = 256
	DefaultCleanupInterval = time.Minute
	DefaultCleanupBatch    = 1000
)

// Options configure the DB scope. The zero value of every optional field
// selects its documented default.
type Options struct {
	// Pool is the PostgreSQL pool the transactions run on. Required. Give
	// it at least as many connections as consumer.Config.Shards, or shards
	// wait for each other's connections (the runner warns at start).
	// pgxpool's default, the greater of 4 and the number of CPUs, is below
	// consumer.DefaultShards (16) on most machines: add pool_max_conns=16
	// to the database URL, or set pgxpool.Config.MaxConns.
	Pool *pgxpool.Pool

	// Consumer names this pipeline in the inbox and offsets tables: records
	// are deduplicated per consumer. Default: the consumer group id. Two
	// pipelines that must not see each other's records as duplicates need
	// different names.
	//
	// Left to default, renaming the group renames the inbox's namespace
	// too: the renamed group, with no committed offset, starts from the
	// reset offset (the earliest by default) and would apply again every
	// record that its topics still hold. Run refuses that first start with
	// a *consumer.ConfigError on Consumer when another consumer of the
	// inbox read the same topics (a group of its name has committed offsets
	// on them, or its stored offsets, parked or waiting records or key
	// versions name them), and logs a warning naming the inbox's other
	// consumers when nothing ties them to these topics. Keep the group id,
	// or set Consumer to the earlier name; a pipeline of its own sets its
	// own name.
	Consumer string

	// TablePrefix prefixes the table names; it must match what [Migrate]
	// was given. Default DefaultTablePrefix.
	//
	// A new prefix starts on empty tables. Records an earlier deployment
	// left waiting behind their key's head in the tables of the old prefix
	// have their offsets committed, and only a runner on those tables
	// applies them: Run refuses to start with a *consumer.ConfigError on
	// TablePrefix while the tables of another prefix (in the search path)
	// hold this consumer's parked or waiting records and those of this one
	// nothing of it, and logs a warning when they hold its inbox only (what
	// it deduplicates would be applied again).
	TablePrefix string

	// BatchSize is the most records of one key-shard handled together.
	// 1 runs one transaction per record. Default 256. Batches form from
	// what is already queued, so under light load they are small and add
	// no latency; under load a bigger batch spreads BEGIN, COMMIT and its
	// WAL flush over more records (BENCHMARKS.md has throughput against
	// batch size). A QueueHandler's batch is one transaction; a Handler's
	// takes at most 64 records per transaction, since each of its records
	// writes after a savepoint of its own and PostgreSQL keeps the ids of
	// 64 subtransactions per transaction in its fast cache. A failing
	// record is rolled back alone; the others commit and are not handled
	// again. BatchLinger makes a worker wait for more.
	BatchSize int

	// BatchLinger is how long a worker waits to fill a batch. Default 0:
	// no added latency; batches fill under load by themselves.
	BatchLinger time.Duration

	// StoreOffsets writes, in each transaction, how far the key-shard has
	// applied the partition. After a crash or a rebalance the next owner
	// resumes from there when it is ahead of the committed Kafka offset,
	// and skips records that are already applied without calling the
	// handler: the duplicate window between a database commit and the
	// Kafka offset commit is gone. Use it when handler calls are costly, or
	// when even a deduplicated redelivery is unwelcome; it costs one more
	// statement per transaction. A stored position is used only under the
	// routing it was written under: the same consumer.Config.Shards, the
	// same Config.NullKeys and kscope's same shard hash. After a change of
	// any of them the positions are ignored until rewritten (the inbox
	// still deduplicates what they would have skipped). Offsets moved back
	// by a replay (kscope replay) are therefore passed over where a stored
	// position is ahead of them, records never applied included: delete
	// the consumer's rows of <prefix>offsets for the topic, with the group
	// stopped, to have them consumed.
	StoreOffsets bool

	// InboxTTL, when positive, deletes inbox rows older than it while the
	// runner runs, CleanupBatch rows at a time every CleanupInterval. A
	// row's age counts from its record's outcome (applied, skipped, stale
	// or dead-lettered), however long the record spent in the retry topics
	// before it; rows of records still in the retry topics stay. A
	// record redelivered after its row was deleted is applied again, so
	// keep the TTL well beyond the longest redelivery and replay you plan
	// for (topic retention is a safe bound). Default 0: keep every row.
	InboxTTL        time.Duration
	CleanupInterval time.Duration
	CleanupBatch    int

	// StartTimeout is how long Run waits at start for a database that
	// does not answer (a refused connection, a timeout, a server starting
	// up): it retries with a backoff that grows to 30 s, logs each
	// attempt at WARN, and reports the wait in the runner's
	// Stats().Waiting, which a readiness probe reads. Past it, Run returns
	// a [*DatabaseError] with TimedOut set that names the address. A
	// database that refuses the runner (a wrong password, a database that
	// does not exist, a missing privilege) fails Run at once, whatever
	// StartTimeout. Default DefaultStartTimeout (1 minute).
	StartTimeout time.Duration

	// Versions, when not nil, turns on version-gap detection: each record
	// carries a per-key version and the key's last applied version is
	// checked and advanced in the record's transaction. See package
	// sequence. Null-key records are not versioned: leave them out of
	// versioned topics. Versions need per-key order, so they do not
	// combine with an Unordered failure policy (consumer.Config.Failures).
	// A key's last version moves only while Versions is set: turned off
	// and on again, keys written in between find gaps at their next
	// record (see sequence.Accept for the first run back).
	Versions *sequence.Config

	// FillGap, when set with Versions, rebuilds a key's state for the
	// versions a record skipped: called for a record found past a gap,
	// before its handler, in the record's transaction (tx; its writes
	// commit with the record's, or roll back with them), whatever the
	// Gaps policy. It fetches the missing state from the service's source
	// of truth and writes it; on nil the handler runs (sequence.FromContext
	// reports the gap), the record's version becomes the key's last and
	// the gap counts as filled (DBStats.GapsFilled). An error fails the
	// record as its handler's would: the failure policy retries it, and
	// FillGap runs again.
	FillGap func(ctx context.Context, tx pgx.Tx, r *consumer.Record, gap sequence.Result) error

	// Periodic, when its Func is set, runs Func in a transaction of its
	// own on every assigned partition, every Interval (see Periodic):
	// time-based expiry of the handlers' state, say. It takes the place
	// of consumer.Config.Periodic, which is refused beside it.
	Periodic Periodic
}

func (o Options) withDefaults(cfg consumer.Config) Options {
	if o.Consumer == "" {
		o.Consumer = cfg.Group
	}
	if o.TablePrefix == "" {
		o.TablePrefix = DefaultTablePrefix
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.CleanupInterval == 0 {
		o.CleanupInterval = DefaultCleanupInterval
	}
	if o.CleanupBatch == 0 {
		o.CleanupBatch = DefaultCleanupBatch
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.Versions != nil {
		v := o.Versions.WithDefaults()
		o.Versions = &v
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &consumer.ConfigError{Struct: "dbscope.Options", Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	if o.Pool == nil {
		bad("Pool", "is nil; pass the *pgxpool.Pool the transactions run on")
	}
	if err := validPrefix(o.TablePrefix); err != nil {
		bad("TablePrefix", "%q is not a plain identifier; use lower-case letters, digits and underscores, starting with a letter or underscore, at most 40 characters", o.TablePrefix)
	}
	if o.BatchSize < 0 {
		bad("BatchSize", "is %d; set it to 1 or more (0 selects %d)", o.BatchSize, DefaultBatchSize)
	}
	if o.BatchLinger < 0 {
		bad("BatchLinger", "is %s; set it to 0 or a positive duration", o.BatchLinger)
	}
	if o.InboxTTL < 0 {
		bad("InboxTTL", "is %s; set it to a positive duration, or 0 to keep inbox rows", o.InboxTTL)
	}
	if o.CleanupInterval < 0 {
		bad("CleanupInterval", "is %s; set it to a positive duration (0 selects %s)", o.CleanupInterval, DefaultCleanupInterval)
	}
	if o.CleanupBatch < 0 {
		bad("CleanupBatch", "is %d; set it to a positive row count (0 selects %d)", o.CleanupBatch, DefaultCleanupBatch)
	}
	if o.StartTimeout < 0 {
		bad("StartTimeout", "is %s; set it to a positive duration (0 selects %s)", o.StartTimeout, DefaultStartTimeout)
	}
	o.validatePeriodic(bad)
	if o.FillGap != nil && o.Versions == nil {
		bad("FillGap", "is set without Versions, which find the gaps it fills; set Versions too, or leave FillGap nil")
	}
	if o.Versions != nil {
		if err := o.Versions.Validate(); err != nil {
			bad("Versions", "%v", err)
		}
	}
	return errors.Join(errs...)
}
