// Package txn is kscope's Kafka scope: exactly-once Kafka-to-Kafka
// pipelines. A handler reads a record and emits output records; the outputs
// and the input offsets commit in one Kafka transaction, so a read_committed
// reader downstream sees every input's outputs exactly once, whatever
// crashes, rebalances or broker faults happen.
//
// # How
//
// The runner is a franz-go GroupTransactSession. It polls, begins a
// transaction, hands the records to the key-shard workers (per-key order,
// parallelism across keys), produces every record's outputs inside the
// transaction, and ends it once every polled record is done, bounded by
// Options.CommitInterval and Options.MaxRecords. Ending commits the consumed
// offsets in the same transaction. A rebalance or a fenced producer during a
// transaction aborts it, and the consumer rewinds to the last committed
// offsets: the aborted outputs are never visible to read_committed readers.
//
// Failures are routed by consumer.Config.Failures inside the transaction: a
// record is retried in place with backoff, skipped, or its dead-letter
// record is produced in the same transaction, so a crash never leaves a
// record both dead-lettered and processed, or lost. With an Unordered
// policy, a record that keeps failing goes to the delayed retry topics
// instead, also inside the transaction; the runner consumes them and holds
// each record until its due time without committing past it (the
// partition is paused, the transaction commits its offset at the held
// record, and the consumer is rewound to it). Keyed records keep per-key
// order by default, so they retry in place: there is no store to park a
// key's later records in, as the DB scope has.
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
// then fences its previous incarnation at once and aborts its open
// transaction, instead of leaving read_committed readers waiting for the
// transaction timeout. Two live members with the same id fence each other:
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
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/lifecycle"
	"github.com/kscope-dev/kscope/partition"
	"github.com/kscope-dev/kscope/retrytopic"
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

	// MaxRecords bounds the input records of one transaction. Default
	// 10,000.
	MaxRecords int

	// TransactionTimeout is how long the broker lets a transaction stay
	// open before aborting it; it must cover CommitInterval plus the
	// slowest handler's in-place retries. Default 2m. Java:
	// transaction.timeout.ms.
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

// Stats are the Kafka scope's counters.
type Stats struct {
	Records      int64 // input records whose outputs (or route) committed
	Outputs      int64 // output records committed
	Committed    int64 // transactions committed
	Aborted      int64 // transactions aborted (rebalance, fault) and replayed
	DeadLettered int64 // input records dead-lettered inside a transaction
	Skipped      int64 // input records skipped as business outcomes
	RetryTopic   int64 // input records sent to a delayed retry topic inside a transaction
	Held         int64 // retry-topic records found not yet due (their partition paused until due)

	Stale        int64 // versioned records at or below their key's last version, skipped
	GapsDetected int64 // versioned records parked ahead of their key's next version
	GapsHealed   int64 // parked records applied once the versions before them were
	GapsAccepted int64 // records applied over a gap (sequence.Accept)
	GapsTimedOut int64 // parked records that waited past GapTimeout and went to the DLT
}

// counters are the Stats of one transaction, or of the runner.
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
}

// New returns a Kafka-scope runner. cfg is the consumer configuration
// (Shards, Failures and Identity apply; MaxInFlight*, CommitInterval and
// DrainTimeout do not: the transaction bounds replace them).
func New(cfg consumer.Config, o Options, h Handler) (*Runner, error) {
	var errs []error
	if h == nil {
		errs = append(errs, &consumer.ConfigError{Struct: "txn", Field: "Handler", Reason: "is nil; pass the function that turns each input into outputs"})
	}
	// Validate the consumer configuration the way every runner does.
	probe, err := consumer.NewRunner(cfg, nopScope{})
	if err != nil {
		errs = append(errs, err)
	} else {
		cfg = probe.Config()
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
	r := &Runner{cfg: cfg, o: o, h: h, log: cfg.Logger.With("group", cfg.Group, "scope", "kafka")}
	if o.Versions != nil {
		r.vs = &versionStore{cfg: *o.Versions, group: cfg.Group, kcfg: cfg, parts: map[tp]*partVersions{}, owned: map[tp]uint64{}}
	}
	return r, nil
}

type nopScope struct{}

func (nopScope) Process(context.Context, []*consumer.Record, func(*consumer.Record)) {}

// Stats returns the runner's counters.
func (r *Runner) Stats() Stats {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	return Stats{
		Records: r.c.records.Load(), Outputs: r.c.outputs.Load(), Committed: r.committed.Load(),
		Aborted: r.aborts.Load(), DeadLettered: r.c.dead.Load(), Skipped: r.c.skipped.Load(),
		RetryTopic: r.c.retryTopic.Load(), Held: r.c.held.Load(),
		Stale: r.c.stale.Load(), GapsDetected: r.c.gapsDetected.Load(), GapsHealed: r.c.gapsHealed.Load(),
		GapsAccepted: r.c.gapsAccepted.Load(), GapsTimedOut: r.c.timedOut.Load(),
	}
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

// txnState is one transaction's bookkeeping, shared by the workers.
type txnState struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	err  error // the first produce or routing failure: the transaction aborts
	ends []delivery
	counters
}

// delivery is an observed delivery that ends when the transaction does.
type delivery struct {
	rec *consumer.Record
	out consumer.Outcome
	err error
}

// end notes how rec's delivery ends if the transaction commits.
func (t *txnState) end(obs *consumer.Observer, rec *consumer.Record, out consumer.Outcome, err error) {
	if obs.Ended(rec) {
		return
	}
	t.mu.Lock()
	t.ends = append(t.ends, delivery{rec, out, err})
	t.mu.Unlock()
}

// finish ends the transaction's observed deliveries.
func (t *txnState) finish(obs *consumer.Observer, committed bool) {
	for _, d := range t.ends {
		if !committed {
			d.out = consumer.OutcomeAborted
		}
		obs.End(d.rec, d.out, d.err)
	}
}

func (t *txnState) fail(err error) {
	t.mu.Lock()
	if t.err == nil {
		t.err = err
	}
	t.mu.Unlock()
}

func (t *txnState) failed() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// produce adds rec to the transaction; a failure aborts it.
func (t *txnState) produce(ctx context.Context, sess *kgo.GroupTransactSession, rec *kgo.Record, what string) {
	t.wg.Add(1)
	sess.Produce(ctx, rec, func(_ *kgo.Record, err error) {
		if err != nil {
			t.fail(produceError(rec.Topic, what, err))
		}
		t.wg.Done()
	})
}

// produceError describes the failure to produce what to topic, naming the
// topic and what to do when it does not exist.
func produceError(topic, what string, err error) error {
	if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) {
		return fmt.Errorf("output topic %s does not exist (producing %s): create it, or enable automatic topic creation "+
			"(auto.create.topics.enable on the broker and kgo.AllowAutoTopicCreation() in Config.ClientOptions): %w", topic, what, err)
	}
	return fmt.Errorf("producing %s to %s: %w", what, topic, err)
}

// item is one unit of work for a key-shard worker: an input record, or a
// parked record whose gap timed out.
type item struct {
	rec    *consumer.Record
	expire *parkedRec
	tx     *txnState
}

// Run consumes, transforms and produces until ctx is canceled (then it
// returns nil after aborting the open transaction) or a fatal error, such
// as being fenced by another producer with the same transactional id.
func (r *Runner) Run(ctx context.Context) error {
	ctx, end, err := r.life.Begin(ctx)
	if err != nil {
		return err
	}
	defer end()

	retryTopics := r.retryTopics()
	topics := append([]string(nil), r.cfg.Topics...)
	delays := map[string]time.Duration{}
	if retryTopics {
		for i, t := range r.cfg.Failures.RetryTopics() {
			topics = append(topics, t)
			delays[t] = r.cfg.Failures.Ladder[i]
		}
	}
	opts := []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer())}
	opts = append(opts, r.cfg.ClientOptions...)
	opts = append(opts,
		kgo.SeedBrokers(r.cfg.Brokers...),
		kgo.ConsumerGroup(r.cfg.Group),
		kgo.ConsumeTopics(topics...),
		kgo.TransactionalID(r.o.TransactionalID),
		kgo.TransactionTimeout(r.o.TransactionTimeout),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RebalanceTimeout(r.cfg.RebalanceTimeout),
		kgo.FetchMaxWait(min(500*time.Millisecond, r.o.CommitInterval*5)),
	)
	obs := consumer.NewObserver(r.cfg.Group, r.cfg.Hooks)
	gone := func(kind string, ps map[string][]int32) {
		obs.Rebalance(kind, count(ps))
		for t, parts := range ps {
			for _, p := range parts {
				obs.Gone(t, p)
			}
		}
		if r.vs != nil {
			r.vs.drop(ps)
		}
	}
	opts = append(opts,
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			obs.Rebalance("assigned", count(ps))
		}),
		// The group's offsets of newly assigned partitions are fetched
		// with RequireStable after OnPartitionsAssigned: only then has a
		// previous owner's last transaction ended, so only then is the
		// version changelog restored.
		kgo.OnOffsetsFetched(func(_ context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
			if r.vs != nil {
				r.vs.assigned(fetchedPartitions(resp))
			}
			return nil
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) { gone("revoked", ps) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) { gone("lost", ps) }),
	)
	if r.vs != nil {
		opts = append(opts, kgo.RecordPartitioner(newChangelogPartitioner(r.cfg.Group, r.cfg.Topics)))
	}
	if err := r.ensureTopics(ctx, retryTopics); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: a clean stop
		}
		return err
	}
	sess, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return fmt.Errorf("kscope: creating the transactional client: %w", err)
	}
	defer sess.Close()
	cl := sess.Client()
	// Initialise the producer ID before the first poll: it fences the
	// previous incarnation of this transactional id and aborts its open
	// transaction. Until then the group's offsets that transaction
	// committed are unstable, and the consumer, which fetches them with
	// RequireStable, would wait for the broker to time it out.
	if _, _, err := cl.ProducerID(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("kscope: initialising the producer ID of transactional id %s: %w", r.o.TransactionalID, err)
	}
	r.warnMissingInputs(ctx, cl)
	f := consumer.NewFailures(r.cfg, cl, r.log)

	var mu sync.Mutex
	assigns := map[string]map[int32]*partition.Assignment{}
	assignment := func(topic string, p int32) *partition.Assignment {
		mu.Lock()
		defer mu.Unlock()
		if assigns[topic] == nil {
			assigns[topic] = map[int32]*partition.Assignment{}
		}
		a := assigns[topic][p]
		if a == nil {
			a = partition.NewAssignment(ctx, commit.NewPartition(topic, p))
			assigns[topic][p] = a
		}
		return a
	}
	pool := partition.NewPool(partition.PoolConfig[item]{
		Shards: r.cfg.Shards,
		Process: func(ctx context.Context, _ *partition.Assignment, batch []item) {
			for _, it := range batch {
				r.handle(ctx, sess, f, it)
				it.tx.wg.Done()
			}
		},
		Drop: func(_ *partition.Assignment, it item) { it.tx.wg.Done() },
	})
	pool.Start()
	defer pool.Stop()
	holds := newHolds(delays)
	lag := newLagState(obs)

	r.log.Info("kscope: transactional runner started", "topics", r.cfg.Topics, "transactional_id", r.o.TransactionalID,
		"retry_topics", retryTopics, "versions", r.vs != nil)
	for ctx.Err() == nil {
		// Sleep in the poll no longer than until a held partition is due
		// or a parked record times out.
		wake := holds.resume(cl, time.Now())
		if r.vs != nil {
			if at := r.vs.nextExpiry(); !at.IsZero() && (wake.IsZero() || at.Before(wake)) {
				wake = at
			}
		}
		pctx, cancel := context.WithCancel(ctx)
		if !wake.IsZero() {
			pctx, cancel = context.WithDeadline(ctx, wake)
		}
		if r.vs != nil {
			r.vs.setKick(cancel)
		}
		fetches := sess.PollRecords(pctx, r.o.MaxRecords)
		if r.vs != nil {
			r.vs.setKick(nil)
		}
		cancel()
		if fetches.IsClientClosed() || ctx.Err() != nil {
			break
		}
		r.logFetchErrors(fetches)
		lag.fetched(obs, fetches)
		var expired []*parkedRec
		if r.vs != nil {
			if err := r.restore(ctx); err != nil {
				break // ctx is done
			}
			expired = r.vs.expired(time.Now())
		}
		if fetches.NumRecords() == 0 && len(expired) == 0 {
			continue
		}
		if err := sess.Begin(); err != nil {
			return fmt.Errorf("kscope: beginning a transaction: %w", err)
		}
		tx := &txnState{}
		deadline := time.Now().Add(r.o.CommitInterval)
		n := 0
		dispatch := func(fs kgo.Fetches) {
			now := time.Now()
			fs.EachRecord(func(rec *kgo.Record) {
				if holds.keep(cl, rec, now) {
					tx.held.Add(1)
					return
				}
				n++
				tx.wg.Add(1)
				shard := partition.Shard(rec.Topic, rec.Partition, rec.Offset, rec.Key, r.cfg.Shards, r.cfg.NullKeys)
				pool.Dispatch(shard, assignment(rec.Topic, rec.Partition), item{rec: &consumer.Record{Record: rec}, tx: tx})
			})
		}
		dispatch(fetches)
		for _, p := range expired {
			tx.wg.Add(1)
			shard := partition.Shard(p.Topic, p.Partition, p.Offset, p.Key, r.cfg.Shards, r.cfg.NullKeys)
			pool.Dispatch(shard, assignment(p.Topic, p.Partition), item{expire: p, tx: tx})
		}
		// Collect more records into this transaction until the interval
		// or the record bound says to end it.
		for n < r.o.MaxRecords && time.Now().Before(deadline) && ctx.Err() == nil {
			pctx, cancel := context.WithDeadline(ctx, deadline)
			more := sess.PollRecords(pctx, r.o.MaxRecords-n)
			cancel()
			if more.IsClientClosed() {
				break
			}
			if r.vs != nil {
				if err := r.restore(ctx); err != nil {
					tx.fail(err)
				}
			}
			lag.fetched(obs, more)
			dispatch(more)
		}
		tx.wg.Wait()

		try := kgo.TryCommit
		if err := tx.failed(); errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
			sess.End(context.WithoutCancel(ctx), kgo.TryAbort) //nolint:errcheck // fenced: nothing of ours can commit
			return fmt.Errorf("kscope: fenced: another producer uses transactional id %s; give every member its own (Options.TransactionalID): %w", r.o.TransactionalID, err)
		}
		if err := tx.failed(); err != nil || ctx.Err() != nil {
			try = kgo.TryAbort
			if err != nil {
				r.log.Warn("kscope: aborting the transaction; its records are consumed again", "err", err)
			}
		}
		endCtx, cancel := context.WithTimeout(holds.commitContext(context.WithoutCancel(ctx)), r.o.TransactionTimeout)
		committed, err := sess.End(endCtx, try)
		if err != nil && r.recovered(endCtx, sess, err) {
			committed, err = false, nil
		}
		cancel()
		if err != nil {
			return fmt.Errorf("kscope: ending the transaction (transactional id %s): %w", r.o.TransactionalID, err)
		}
		holds.ended(cl, committed)
		if r.vs != nil {
			r.vs.end(committed)
		}
		tx.finish(obs, committed)
		if committed {
			obs.Commit(lag.partitions(), nil)
			lag.report(obs, cl)
		} else {
			obs.Commit(lag.partitions(), errAborted)
		}
		lag.reset()
		r.statsMu.Lock()
		r.c.held.Add(tx.held.Load())
		if committed {
			r.committed.Add(1)
			r.c.add(&tx.counters)
		} else {
			r.aborts.Add(1)
		}
		r.statsMu.Unlock()
	}
	r.log.Info("kscope: transactional runner stopped")
	return nil
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
	if err := consumer.EnsureFailureTopics(ctx, r.cfg, retryTopics); err != nil {
		return err
	}
	if r.vs != nil {
		return ensureChangelogs(ctx, r.cfg)
	}
	return nil
}

// warnMissingInputs logs, once, every input topic that does not exist:
// the consumer waits for it to be created, and would otherwise wait
// silently.
func (r *Runner) warnMissingInputs(ctx context.Context, cl *kgo.Client) {
	td, err := kadm.NewClient(cl).ListTopics(ctx, r.cfg.Topics...)
	if err != nil {
		r.log.Debug("kscope: could not look the input topics up", "err", err)
		return
	}
	for _, t := range r.cfg.Topics {
		if d, ok := td[t]; !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			r.log.Warn("kscope: input topic "+t+" does not exist; the runner waits until it is created (create it, or correct Config.Topics)", "topic", t)
		}
	}
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

// handle runs one work item on its key-shard worker.
func (r *Runner) handle(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, it item) {
	if ctx.Err() != nil || it.tx.failed() != nil {
		return
	}
	switch {
	case it.expire != nil:
		r.expire(ctx, sess, f, it.tx, it.expire)
	case r.vs != nil && it.rec.Key != nil:
		r.handleVersioned(ctx, sess, f, it.tx, it.rec)
	default:
		obs := f.Observer()
		hctx := obs.Start(ctx, it.rec)
		out, err := r.run(ctx, hctx, sess, f, it.tx, it.rec)
		if out != consumer.OutcomeAborted {
			it.tx.records.Add(1)
		}
		it.tx.end(obs, it.rec, out, err)
	}
}

// run runs rec's handler with in-place retries, then produces its outputs,
// or routes it, into the transaction. hctx is the handler's context. It
// returns the delivery's outcome (success, skipped, retried, dead_lettered,
// or aborted when the transaction is failing or the runner stopping) and
// the last handler error.
func (r *Runner) run(ctx, hctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, tx *txnState, rec *consumer.Record) (consumer.Outcome, error) {
	var first time.Time
	obs := f.Observer()
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil || tx.failed() != nil {
			return consumer.OutcomeAborted, nil
		}
		em := &emitter{}
		err := callHandler(hctx, r.h, rec, em)
		if err == nil {
			for _, out := range em.out {
				tx.outputs.Add(1)
				obs.Inject(hctx, out)
				tx.produce(ctx, sess, out, fmt.Sprintf("an output of %s[%d]@%d", rec.Topic, rec.Partition, rec.Offset))
			}
			return consumer.OutcomeSuccess, nil
		}
		if ctx.Err() != nil {
			return consumer.OutcomeAborted, err
		}
		if first.IsZero() {
			first = time.Now()
		}
		step := f.Decide(ctx, rec, err, attempt, r.retryTopics())
		switch step.Action {
		case retrytopic.ActionRetry:
			f.Route(ctx, rec, err, step, attempt, first) //nolint:errcheck // logs and counts only
			if !backoff.Sleep(ctx, step.Delay) {
				return consumer.OutcomeAborted, err
			}
			continue
		case retrytopic.ActionSkip:
			f.Route(ctx, rec, err, step, attempt, first) //nolint:errcheck // logs and counts only
			tx.skipped.Add(1)
			return consumer.OutcomeSkipped, err
		case retrytopic.ActionRetryTopic:
			// The retry record joins the transaction: it becomes visible
			// exactly when the input's offset commits.
			out := f.RetryTopicRecord(rec, err, step, attempt, first)
			r.route(ctx, sess, f, tx, rec, out, "retry", step.Class.String())
			tx.retryTopic.Add(1)
			obs.Event(rec, consumer.EventRetryTopic, out.Topic)
			r.log.Warn("kscope: record sent to a retry topic (in the transaction)",
				"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "retry_topic", out.Topic, "delay", step.Delay, "err", err)
			return consumer.OutcomeRetried, err
		default:
			r.deadLetter(ctx, sess, f, tx, rec, err, step, attempt, first)
			return consumer.OutcomeDeadLettered, err
		}
	}
}

// deadLetter produces rec's dead-letter record into the transaction: it
// becomes visible exactly when the input's offset commits.
func (r *Runner) deadLetter(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, tx *txnState, rec *consumer.Record, err error, step retrytopic.Step, attempt int, first time.Time) {
	dl := f.DeadLetterRecord(rec, err, step, attempt, first)
	r.route(ctx, sess, f, tx, rec, dl, "dlt", step.Class.String())
	tx.dead.Add(1)
	f.Observer().Event(rec, consumer.EventDeadLetter, dl.Topic)
	r.log.Error("kscope: record sent to the dead-letter topic (in the transaction)",
		"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "class", step.Class.String(), "err", err)
}

// route adds a retry or dead-letter record to the transaction.
func (r *Runner) route(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, tx *txnState, rec *consumer.Record, out *kgo.Record, kind, class string) {
	obs := f.Observer()
	tx.wg.Add(1)
	sess.Produce(ctx, out, func(_ *kgo.Record, err error) {
		obs.Route(consumer.Route{Topic: rec.Topic, Kind: kind, Class: class, Target: out.Topic, Err: err})
		if err != nil {
			tx.fail(produceError(out.Topic, fmt.Sprintf("the %s record of %s[%d]@%d", kind, rec.Topic, rec.Partition, rec.Offset), err))
		}
		tx.wg.Done()
	})
}

// handleVersioned checks rec's version against its key's last applied one
// and applies, skips, parks or dead-letters it.
func (r *Runner) handleVersioned(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, tx *txnState, rec *consumer.Record) {
	vers := r.vs.cfg
	obs := f.Observer()
	hctx := obs.Start(ctx, rec)
	now := time.Now()
	v, err := vers.Version(rec)
	if err != nil {
		herr := consumer.DecodeError(err) // poison: the DLT, with the reason
		r.deadLetter(ctx, sess, f, tx, rec, herr, f.Decide(ctx, rec, herr, 1, false), 1, now)
		tx.records.Add(1)
		tx.end(obs, rec, consumer.OutcomeDeadLettered, herr)
		return
	}
	pv := r.vs.get(tp{rec.Topic, rec.Partition})
	if pv == nil {
		tx.fail(fmt.Errorf("%s[%d] is no longer assigned to this member", rec.Topic, rec.Partition))
		tx.end(obs, rec, consumer.OutcomeAborted, nil)
		return
	}
	key := string(rec.Key)
	last, known := pv.lastOf(key)
	check := vers.Check(v, last, known)
	switch {
	case check.Outcome == sequence.Stale:
		tx.stale.Add(1)
		tx.records.Add(1)
		tx.end(obs, rec, consumer.OutcomeStale, nil)
		return
	case check.Outcome == sequence.Gap && vers.Gaps == sequence.DeadLetter:
		gap := &retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}
		obs.Event(rec, consumer.EventVersionGap, gap.Error())
		herr := consumer.Terminal(gap)
		r.deadLetter(ctx, sess, f, tx, rec, herr, f.Decide(ctx, rec, herr, 1, false), 1, now)
		tx.records.Add(1)
		tx.end(obs, rec, consumer.OutcomeDeadLettered, herr)
		return
	case check.Outcome == sequence.Gap && vers.Gaps == sequence.Wait:
		obs.Event(rec, consumer.EventVersionGap, (&retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}).Error())
		if pv.parkedAt(key, v) == nil { // a redelivery of a parked record stays parked as it was
			p := &parkedRec{Version: v, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Timestamp: rec.Timestamp,
				Key: rec.Key, Value: rec.Value, Headers: rec.Headers, Since: now}
			val, err := json.Marshal(p)
			if err != nil {
				tx.fail(fmt.Errorf("encoding the parked record of %s[%d]@%d: %w", rec.Topic, rec.Partition, rec.Offset, err))
				return
			}
			pv.setParked(key, v, p)
			r.changelog(ctx, sess, tx, rec.Topic, rec.Partition, parkedKey(rec.Key, v), val)
			tx.gapsDetected.Add(1)
		}
		tx.records.Add(1)
		tx.end(obs, rec, consumer.OutcomeGap, nil)
		return
	case check.Outcome == sequence.Gap:
		obs.Event(rec, consumer.EventVersionGap, (&retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}).Error())
	}
	out, herr := r.run(ctx, sequence.WithResult(hctx, check), sess, f, tx, rec)
	tx.end(obs, rec, out, herr)
	if out == consumer.OutcomeAborted {
		return
	}
	tx.records.Add(1)
	if out != consumer.OutcomeSuccess && out != consumer.OutcomeSkipped {
		return // dead-lettered: the key's version stays
	}
	if check.Outcome == sequence.Gap {
		tx.gapsAccepted.Add(1)
	}
	r.advance(ctx, sess, tx, pv, rec, v)
	r.releaseParked(ctx, sess, f, tx, pv, rec, v)
}

// advance records v as the last applied version of rec's key.
func (r *Runner) advance(ctx context.Context, sess *kgo.GroupTransactSession, tx *txnState, pv *partVersions, rec *consumer.Record, v int64) {
	pv.setLast(string(rec.Key), v)
	r.changelog(ctx, sess, tx, rec.Topic, rec.Partition, append([]byte{kindVersion}, rec.Key...), []byte(strconv.FormatInt(v, 10)))
}

// releaseParked applies the parked records of rec's key that follow v, in
// version order, in this transaction.
func (r *Runner) releaseParked(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, tx *txnState, pv *partVersions, rec *consumer.Record, v int64) {
	key := string(rec.Key)
	for {
		p := pv.parkedAt(key, v+1)
		if p == nil {
			return
		}
		pr := p.record()
		obs := f.Observer()
		hctx := obs.Start(ctx, pr)
		obs.Event(pr, consumer.EventVersionHeal, "")
		check := sequence.Result{Outcome: sequence.Applied, Version: v + 1, Last: v}
		out, herr := r.run(ctx, sequence.WithResult(hctx, check), sess, f, tx, pr)
		if out == consumer.OutcomeAborted {
			tx.end(obs, pr, out, herr)
			return
		}
		r.unpark(ctx, sess, tx, pv, p)
		tx.end(obs, pr, out, herr)
		if out != consumer.OutcomeSuccess && out != consumer.OutcomeSkipped {
			return
		}
		tx.gapsHealed.Add(1)
		v++
		r.advance(ctx, sess, tx, pv, pr, v)
	}
}

// expire sends a parked record that waited past GapTimeout to the DLT.
func (r *Runner) expire(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, tx *txnState, p *parkedRec) {
	pv := r.vs.get(tp{p.Topic, p.Partition})
	if pv == nil {
		tx.fail(fmt.Errorf("%s[%d] is no longer assigned to this member", p.Topic, p.Partition))
		return
	}
	key := string(p.Key)
	if pv.parkedAt(key, p.Version) == nil {
		return // released in this transaction
	}
	last, _ := pv.lastOf(key)
	rec := p.record()
	obs := f.Observer()
	obs.Start(ctx, rec)
	herr := consumer.Terminal(&retrytopic.VersionGapError{Expected: last + 1, Actual: p.Version})
	step := f.Decide(ctx, rec, herr, 1, false)
	r.deadLetter(ctx, sess, f, tx, rec, herr, step, 1, p.Since)
	r.unpark(ctx, sess, tx, pv, p)
	tx.timedOut.Add(1)
	tx.end(obs, rec, consumer.OutcomeDeadLettered, herr)
}

func (r *Runner) unpark(ctx context.Context, sess *kgo.GroupTransactSession, tx *txnState, pv *partVersions, p *parkedRec) {
	pv.setParked(string(p.Key), p.Version, nil)
	r.changelog(ctx, sess, tx, p.Topic, p.Partition, parkedKey(p.Key, p.Version), nil)
}

// changelog writes one changelog record into the transaction, to the
// partition of the input partition it belongs to.
func (r *Runner) changelog(ctx context.Context, sess *kgo.GroupTransactSession, tx *txnState, topic string, p int32, key, value []byte) {
	tx.produce(ctx, sess, &kgo.Record{Topic: VersionsTopic(r.cfg.Group, topic), Partition: p, Key: key, Value: value}, "a version changelog record")
}

func callHandler(ctx context.Context, h Handler, r *consumer.Record, out Emitter) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("kscope: handler panicked: %v", p)
		}
	}()
	return h.Handle(ctx, r, out)
}

var errAborted = errors.New("kscope: the transaction aborted; its offsets did not commit")

// fetchedPartitions returns the partitions whose offsets resp holds.
func fetchedPartitions(resp *kmsg.OffsetFetchResponse) map[string][]int32 {
	ps := map[string][]int32{}
	for _, g := range resp.Groups {
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode == 0 {
					ps[t.Topic] = append(ps[t.Topic], p.Partition)
				}
			}
		}
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode == 0 && !slices.Contains(ps[t.Topic], p.Partition) {
				ps[t.Topic] = append(ps[t.Topic], p.Partition)
			}
		}
	}
	return ps
}

func count(ps map[string][]int32) int {
	n := 0
	for _, p := range ps {
		n += len(p)
	}
	return n
}

// lagState keeps what the lag hooks need about the partitions of the open
// transaction: their high watermarks and the timestamp of their last
// record.
type lagState struct {
	on    bool
	fetch bool
	hwm   map[tp]int64
	last  map[tp]time.Time
}

func newLagState(obs *consumer.Observer) *lagState {
	return &lagState{on: obs.WantsLag(), fetch: obs.WantsFetch(), hwm: map[tp]int64{}, last: map[tp]time.Time{}}
}

func (l *lagState) fetched(obs *consumer.Observer, fs kgo.Fetches) {
	if !l.on && !l.fetch {
		return
	}
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		obs.Fetched(p.Topic, p.Partition, len(p.Records))
		k := tp{p.Topic, p.Partition}
		l.hwm[k] = p.HighWatermark
		l.last[k] = p.Records[len(p.Records)-1].Timestamp
	})
}

func (l *lagState) partitions() int { return len(l.hwm) }

// report reports, after a commit, each partition of the transaction: the
// records between its committed offset and its high watermark and, while
// there are some, the age of its last committed record, an upper bound of
// the age of the oldest unfinished one.
func (l *lagState) report(obs *consumer.Observer, cl *kgo.Client) {
	if !l.on || len(l.hwm) == 0 {
		return
	}
	committed := cl.CommittedOffsets()
	now := time.Now()
	for k, hwm := range l.hwm {
		eo, ok := committed[k.topic][k.partition]
		if !ok {
			continue
		}
		lg := consumer.Lag{Topic: k.topic, Partition: k.partition, Offsets: max(hwm-eo.Offset, 0)}
		if lg.Offsets > 0 {
			lg.Age = max(now.Sub(l.last[k]), 0)
		}
		obs.Lag(lg)
	}
}

func (l *lagState) reset() {
	clear(l.hwm)
	clear(l.last)
}
