// Package txn is kscope's Kafka scope: exactly-once Kafka-to-Kafka
// pipelines. A handler reads a record and emits output records; the outputs
// and the input offsets commit in one Kafka transaction, so a read_committed
// reader downstream sees every input's outputs exactly once, whatever
// crashes, rebalances or broker faults happen.
//
// # How
//
// The runner is a franz-go GroupTransactSession. It polls and hands the
// records to the key-shard workers (per-key order, parallelism across
// keys). A worker runs a record's handler and, once the record is
// finished, adds its outputs (or its route) to the open transaction. The
// transaction ends Options.CommitInterval after the first record joined
// it, or once Options.MaxRecords did, and commits, with the outputs, each
// partition's offset at its lowest unfinished record. A rebalance or a
// fenced producer during a transaction aborts it, and the consumer rewinds
// to the last committed offsets: the aborted outputs are never visible to
// read_committed readers.
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
// partition is paused and the consumer rewound to the held record). Keyed
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
// the dead-letter topic with the expected and actual versions.
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
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/engine"
	"github.com/kscope-dev/kscope/internal/lifecycle"
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

	// MaxRecords bounds the input records of one transaction, and the
	// polled records waiting for a worker. Default 10,000.
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
	// not combine with an Unordered failure policy.
	Versions *sequence.Config
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
	if o.Versions != nil {
		if err := o.Versions.Validate(); err != nil {
			bad("Versions", "%v", err)
		}
	}
	return errors.Join(errs...)
}

// counters are the Kafka-scope counters (consumer.KafkaStats) of one
// transaction, or of the runner.
type counters struct {
	records, outputs, dead, skipped, retryTopic, held       atomic.Int64
	stale, gapsDetected, gapsHealed, gapsAccepted, timedOut atomic.Int64
}

func (c *counters) add(o *counters) {
	c.records.Add(o.records.Load())
	c.outputs.Add(o.outputs.Load())
	c.dead.Add(o.dead.Load())
	c.skipped.Add(o.skipped.Load())
	c.retryTopic.Add(o.retryTopic.Load())
	c.stale.Add(o.stale.Load())
	c.gapsDetected.Add(o.gapsDetected.Load())
	c.gapsHealed.Add(o.gapsHealed.Load())
	c.gapsAccepted.Add(o.gapsAccepted.Load())
	c.timedOut.Add(o.timedOut.Load())
}

// Runner runs a Kafka-scope pipeline. Build it with [New], Run it, Close it.
type Runner struct {
	cfg consumer.Config
	o   Options
	h   Handler
	log *slog.Logger

	life lifecycle.State
	vs   *versionStore // nil without Options.Versions

	statsMu           sync.Mutex // a transaction's counters join the runner's at once
	c                 counters
	committed, aborts atomic.Int64
	rebalances        atomic.Int64
	assigned          atomic.Int64 // partitions assigned now

	clMu sync.Mutex
	cl   *kgo.Client // while Run runs

	dltLog *ratelog.Limiter // one ERROR line per dead letter, up to a burst per window
}

// New returns a Kafka-scope runner. cfg is the consumer configuration:
// Brokers, Group, Topics, ClientOptions (before kscope's own, as in every
// scope), Shards, NullKeys, RebalanceTimeout, Logger, Identity, Failures
// and Hooks apply; MaxInFlight*, CommitInterval and DrainTimeout do not:
// the transaction bounds (Options.MaxRecords, Options.CommitInterval,
// Options.TransactionTimeout) replace them.
func New(cfg consumer.Config, o Options, h Handler) (*Runner, error) {
	var errs []error
	if h == nil {
		errs = append(errs, &consumer.ConfigError{Struct: "txn.New's handler", Reason: "is nil; pass the function that turns each input into outputs"})
	}
	// Validate the consumer configuration the way every runner does.
	cfg, err := engine.CheckConfig(cfg)
	if err != nil {
		errs = append(errs, err)
	}
	o = o.withDefaults(cfg.Group)
	errs = append(errs, o.validate())
	if o.Versions != nil && cfg.Failures.Unordered {
		errs = append(errs, &consumer.ConfigError{Struct: "txn.Options", Field: "Versions",
			Reason: "is set with Config.Failures.Unordered; versions are applied in per-key order, so unset one of them"})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	r := &Runner{cfg: cfg, o: o, h: h, log: cfg.Logger.With("group", cfg.Group, "scope", "kafka"), dltLog: ratelog.New(10, 10*time.Second)}
	if o.Versions != nil {
		r.vs = &versionStore{cfg: *o.Versions, group: cfg.Group, kcfg: cfg, parts: map[tp]*partVersions{}, owned: map[tp]uint64{}, expiringSet: map[*parkedRec]bool{}}
	}
	return r, nil
}

// Stats returns a snapshot of the runner's counters: the Kafka scope's in
// Stats.Kafka; of the runner-wide ones, Done (input records committed),
// Commits (transactions committed), Assigned and Rebalances.
func (r *Runner) Stats() consumer.Stats {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	k := consumer.KafkaStats{
		Records: r.c.records.Load(), Outputs: r.c.outputs.Load(), Committed: r.committed.Load(),
		Aborted: r.aborts.Load(), DeadLettered: r.c.dead.Load(), Skipped: r.c.skipped.Load(),
		RetryTopic: r.c.retryTopic.Load(), Held: r.c.held.Load(),
		Stale: r.c.stale.Load(), GapsDetected: r.c.gapsDetected.Load(), GapsHealed: r.c.gapsHealed.Load(),
		GapsAccepted: r.c.gapsAccepted.Load(), GapsTimedOut: r.c.timedOut.Load(),
	}
	return consumer.Stats{Done: k.Records, Commits: k.Committed, Assigned: int(r.assigned.Load()),
		Rebalances: r.rebalances.Load(), Kafka: k}
}

// Client returns the runner's transactional Kafka client while Run is
// running, else nil. Use it for what kscope does not wrap (metadata, lag
// queries); do not poll, produce, commit or close it.
func (r *Runner) Client() *kgo.Client {
	r.clMu.Lock()
	defer r.clMu.Unlock()
	return r.cl
}

// Close stops a running Run and waits for it; idempotent.
func (r *Runner) Close() error { return r.life.Close() }

// retryTopics reports whether failing records go to the delayed retry
// topics: only with an Unordered policy (and no versions), as in the
// AtLeastOnce scope.
func (r *Runner) retryTopics() bool {
	return r.cfg.Failures.Unordered && r.o.Versions == nil && len(r.cfg.Failures.RetryTopics()) > 0
}

// emitter buffers one record's outputs.
type emitter struct{ out []*kgo.Record }

func (e *emitter) Emit(r *kgo.Record) { e.out = append(e.out, r) }

// timedOut returns the error that reports a transaction timeout when the
// transaction that failed with err had been open for open, at least
// TransactionTimeout: the broker then aborts it and fences the producer,
// and the producer's next request fails.
func (r *Runner) timedOut(open time.Duration, err error) error {
	if open < r.o.TransactionTimeout {
		return nil
	}
	return fmt.Errorf("%w: the transaction was open for %s, longer than Options.TransactionTimeout (%s), "+
		"so the broker aborted it and fenced this producer; raise Options.TransactionTimeout (the broker caps it at transaction.max.timeout.ms) "+
		"or find what made producing or committing that slow: %w", ErrTransactionTimedOut, open.Round(time.Millisecond), r.o.TransactionTimeout, err)
}

// fenced describes a fenced producer: by a transaction timeout when the
// transaction had been open for TransactionTimeout, else by another
// producer with the same transactional id.
func (r *Runner) fenced(err error, open time.Duration) error {
	if terr := r.timedOut(open, err); terr != nil {
		return terr
	}
	return fmt.Errorf("%w: another producer uses transactional id %s; give every member its own (Options.TransactionalID): %w", ErrFenced, r.o.TransactionalID, err)
}

// fetchedOffset is a committed offset and its metadata.
type fetchedOffset struct {
	offset int64
	meta   string
}

// fetchedOffsets returns the committed offsets resp holds.
func fetchedOffsets(resp *kmsg.OffsetFetchResponse) map[tp]fetchedOffset {
	out := map[tp]fetchedOffset{}
	add := func(topic string, p int32, code int16, offset int64, meta *string) {
		if code != 0 {
			return
		}
		fo := fetchedOffset{offset: offset}
		if meta != nil {
			fo.meta = *meta
		}
		out[tp{topic, p}] = fo
	}
	for _, g := range resp.Groups {
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				add(t.Topic, p.Partition, p.ErrorCode, p.Offset, p.Metadata)
			}
		}
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if _, ok := out[tp{t.Topic, p.Partition}]; !ok {
				add(t.Topic, p.Partition, p.ErrorCode, p.Offset, p.Metadata)
			}
		}
	}
	return out
}

// recovered reports whether a transaction whose End failed with err is
// cleanly aborted and the session rewound to the committed offsets, so the
// runner can go on. End fails this way when the offset commit inside the
// transaction gets an error the client does not itself treat as abortable
// (REQUEST_TIMED_OUT, say): it has already ended the transaction as an
// abort. A second abort confirms that no transaction is left open; a fenced
// or unauthorized producer is never recovered.
func (r *Runner) recovered(ctx context.Context, sess *kgo.GroupTransactSession, err error) bool {
	switch {
	case ctx.Err() != nil,
		errors.Is(err, kerr.ProducerFenced), errors.Is(err, kerr.InvalidProducerEpoch),
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed), errors.Is(err, kerr.GroupAuthorizationFailed),
		errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return false
	}
	if _, aerr := sess.End(ctx, kgo.TryAbort); aerr != nil {
		return false
	}
	r.log.Warn("kscope: the transaction could not commit and was aborted; its records are consumed again", "err", err)
	return true
}

func (r *Runner) logFetchErrors(fs kgo.Fetches) {
	fs.EachError(func(t string, p int32, err error) {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return // the poll's own wake-up deadline
		}
		r.log.Warn("kscope: fetch error; the client retries", "topic", t, "partition", p, "err", err)
	})
}

func (r *Runner) ensureTopics(ctx context.Context, retryTopics bool) error {
	if err := engine.EnsureFailureTopics(ctx, r.cfg, retryTopics); err != nil {
		return err
	}
	if r.vs != nil {
		return ensureChangelogs(ctx, r.cfg)
	}
	return nil
}

// restore loads the version state of the input partitions this member owns
// and has not loaded yet, retrying with backoff while the changelog cannot
// be read; it fails only when ctx is done.
func (r *Runner) restore(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		need := r.vs.missing(r.cfg.Topics)
		if len(need) == 0 {
			return nil
		}
		err := r.vs.restore(ctx, need)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
		r.log.Warn("kscope: restoring versions from the changelog failed; retrying", "err", err, "retry_in", d)
		if !backoff.Sleep(ctx, d) {
			return ctx.Err()
		}
	}
}
