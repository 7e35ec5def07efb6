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
		r.vs = &versionStore{cfg: *o.Versions, group: cfg.Group, kcfg: cfg, parts: map[tp]*partVersions{}, owned: map[tp]uint64{}, expiringSet: map[*parkedRec]bool{}}
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

// txnState is one transaction's bookkeeping, shared by the workers that
// join it.
type txnState struct {
	wg    sync.WaitGroup // produces not acknowledged yet
	mu    sync.Mutex
	err   error // the first produce or routing failure: the transaction aborts
	ends  []delivery
	first time.Time // when the first worker joined
	joins int       // input records joined
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

// gate lets the key-shard workers add finished records to the open
// transaction, and the poll loop end it while none is adding. A worker
// joins only once its record is finished: a record that retries in place
// waits between its attempts outside any transaction, so it holds its
// key-shard and nothing else.
type gate struct {
	mu     sync.Mutex
	cond   sync.Cond
	tx     *txnState // the open transaction; nil while one ends
	joined int       // workers adding to tx
	closed bool
	kick   func() // wakes the poll loop
	max    int    // input records after which the transaction ends early
}

func newGate(maxRecords int) *gate {
	g := &gate{max: maxRecords}
	g.cond.L = &g.mu
	return g
}

// join waits for an open transaction and returns it, or nil when the
// runner stops or the work of epoch of p is stale (its partition was
// rewound or revoked). The caller adds its outputs and calls leave.
func (g *gate) join(p *partState, epoch uint64) *txnState {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.tx == nil && !g.closed {
		g.cond.Wait()
	}
	if g.closed || !p.current(epoch) {
		return nil
	}
	g.joined++
	if g.tx.first.IsZero() {
		g.tx.first = time.Now()
		g.wake()
	}
	return g.tx
}

// leave ends a join; input says whether it added an input record.
func (g *gate) leave(tx *txnState, input bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.joined--
	if input {
		tx.joins++
		if tx.joins == g.max {
			g.wake()
		}
	}
	if g.joined == 0 {
		g.cond.Broadcast()
	}
}

func (g *gate) wake() {
	if g.kick != nil {
		g.kick()
	}
}

// setKick registers the function that wakes the poll loop.
func (g *gate) setKick(f func()) {
	g.mu.Lock()
	g.kick = f
	g.mu.Unlock()
}

// open makes tx the transaction workers join.
func (g *gate) open(tx *txnState) {
	g.mu.Lock()
	g.tx = tx
	g.cond.Broadcast()
	g.mu.Unlock()
}

// shut stops workers from joining the open transaction, waits for those
// adding to it, and returns it.
func (g *gate) shut() *txnState {
	g.mu.Lock()
	defer g.mu.Unlock()
	tx := g.tx
	g.tx = nil
	for g.joined > 0 {
		g.cond.Wait()
	}
	return tx
}

// close releases every worker waiting to join: nothing joins any more.
func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	g.tx = nil
	g.cond.Broadcast()
	g.mu.Unlock()
}

// endAt returns when the open transaction ends: CommitInterval after its
// first join, at once when it holds MaxRecords input records, or never
// (zero) while nothing joined it.
func (g *gate) endAt(interval time.Duration) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.tx == nil || g.tx.first.IsZero() {
		return time.Time{}
	}
	if g.tx.joins >= g.max {
		return g.tx.first
	}
	return g.tx.first.Add(interval)
}

// item is one unit of work for a key-shard worker: an input record, or a
// parked record whose gap timed out, of one epoch of its partition.
type item struct {
	part   *partState
	epoch  uint64
	rec    *consumer.Record
	expire *parkedRec
}

// work collects what handling one item adds to the transaction it joins:
// outputs, routed records, changelog records and state changes.
type work struct {
	part    *partState
	epoch   uint64
	fx      []func(tx *txnState)
	stopped bool // the runner stops or the item's epoch is stale: nothing joins
}

func (w *work) do(f func(tx *txnState)) { w.fx = append(w.fx, f) }

// stale reports whether the item is no longer wanted.
func (w *work) stale(ctx context.Context) bool {
	if ctx.Err() != nil || !w.part.current(w.epoch) {
		w.stopped = true
	}
	return w.stopped
}

// parts are the runner's assigned input partitions.
type parts struct {
	mu sync.Mutex
	m  map[tp]*partState
}

func (ps *parts) get(k tp) *partState {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.m[k]
}

func (ps *parts) all() []*partState {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]*partState, 0, len(ps.m))
	for _, p := range ps.m {
		out = append(out, p)
	}
	return out
}

// commitOffsets returns the context that ends a transaction: it commits,
// for every assigned partition, the offset at its lowest unfinished record
// and the finished records above it; and the function that installs them
// once the transaction committed.
func (ps *parts) commitOffsets(ctx context.Context) (context.Context, func()) {
	type point struct {
		p      *partState
		w, end int64
		meta   string
		undone []int64
	}
	var points []point
	for _, p := range ps.all() {
		w, meta, end, undone, changed := p.commitPoint()
		if changed {
			points = append(points, point{p, w, end, meta, undone})
		}
	}
	set := map[tp]point{}
	for _, pt := range points {
		set[tp{pt.p.topic, pt.p.partition}] = pt
	}
	ctx = kgo.PreTxnCommitFnContext(ctx, func(req *kmsg.TxnOffsetCommitRequest) error {
		seen := map[tp]bool{}
		topics := req.Topics[:0]
		for _, t := range req.Topics {
			parts := t.Partitions[:0]
			for _, rp := range t.Partitions {
				k := tp{t.Topic, rp.Partition}
				pt, ok := set[k]
				if !ok {
					continue // nothing of ours to commit: the session's head may lie past unfinished records
				}
				seen[k] = true
				rp.Offset, rp.LeaderEpoch, rp.Metadata = pt.w, -1, kmsg.StringPtr(pt.meta)
				parts = append(parts, rp)
			}
			if len(parts) > 0 {
				t.Partitions = parts
				topics = append(topics, t)
			}
		}
		req.Topics = topics
		for k, pt := range set {
			if seen[k] {
				continue
			}
			i := slices.IndexFunc(req.Topics, func(t kmsg.TxnOffsetCommitRequestTopic) bool { return t.Topic == k.topic })
			if i < 0 {
				t := kmsg.NewTxnOffsetCommitRequestTopic()
				t.Topic = k.topic
				req.Topics = append(req.Topics, t)
				i = len(req.Topics) - 1
			}
			rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = k.partition, pt.w, -1, kmsg.StringPtr(pt.meta)
			req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
		}
		return nil
	})
	return ctx, func() {
		for _, pt := range points {
			pt.p.committed(pt.w, pt.end, pt.undone)
		}
	}
}

// rewind rewinds every assigned partition to its committed state after an
// abort.
func (ps *parts) rewind(cl *kgo.Client) {
	set := map[string]map[int32]kgo.EpochOffset{}
	for _, p := range ps.all() {
		if o, ok := p.rewind(); ok {
			if set[p.topic] == nil {
				set[p.topic] = map[int32]kgo.EpochOffset{}
			}
			set[p.topic][p.partition] = kgo.EpochOffset{Epoch: -1, Offset: o}
		}
	}
	if len(set) > 0 {
		cl.SetOffsets(set)
	}
}

// Run consumes, transforms and produces until ctx is canceled (then it
// commits what is finished and returns nil) or a fatal error, such as
// being fenced by another producer with the same transactional id.
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
		kgo.TransactionalID(r.o.TransactionalID),
		kgo.TransactionTimeout(r.o.TransactionTimeout),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RebalanceTimeout(r.cfg.RebalanceTimeout),
		kgo.FetchMaxWait(min(500*time.Millisecond, r.o.CommitInterval*5)),
	)
	obs := consumer.NewObserver(r.cfg.Group, r.cfg.Hooks)
	g := newGate(r.o.MaxRecords)
	var backlogs atomic.Int64
	owned := &parts{m: map[tp]*partState{}}
	var pool *partition.Pool[item]
	dispatch := func(p *partState, rec *kgo.Record) {
		it := item{part: p, epoch: p.epoch, rec: &consumer.Record{Record: rec}}
		pool.Dispatch(partition.Shard(rec.Topic, rec.Partition, rec.Offset, rec.Key, r.cfg.Shards, r.cfg.NullKeys), p.a, it)
	}
	gone := func(kind string, ps map[string][]int32) {
		obs.Rebalance(kind, count(ps))
		owned.mu.Lock()
		for t, parts := range ps {
			for _, p := range parts {
				obs.Gone(t, p)
				if st := owned.m[tp{t, p}]; st != nil {
					st.leave()
					pool.Purge(st.a)
					delete(owned.m, tp{t, p})
				}
			}
		}
		owned.mu.Unlock()
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
		// previous owner's last transaction ended. Their metadata says
		// which records above the offset are done; the version changelog
		// is restored only then too.
		kgo.OnOffsetsFetched(func(_ context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
			fetched := fetchedOffsets(resp)
			owned.mu.Lock()
			for k, fo := range fetched {
				st := newPartState(k.topic, k.partition, partition.NewAssignment(ctx, commit.NewPartition(k.topic, k.partition)), dispatch, &backlogs)
				if err := st.setCommitted(fo.offset, fo.meta); err != nil {
					r.log.Warn("kscope: the committed offset's metadata is not kscope's; records above the offset are handled again",
						"topic", k.topic, "partition", k.partition, "offset", fo.offset, "err", err)
				}
				if old := owned.m[k]; old != nil {
					old.leave()
				}
				owned.m[k] = st
			}
			owned.mu.Unlock()
			if r.vs != nil {
				ps := map[string][]int32{}
				for k := range fetched {
					ps[k.topic] = append(ps[k.topic], k.partition)
				}
				r.vs.assigned(ps)
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
	// Retry topics the policy no longer names are drained, as the other
	// scopes drain them.
	left, err := consumer.LeftoverRetryTopics(ctx, r.cfg, retryTopics)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	for t, d := range left {
		topics = append(topics, t)
		delays[t] = d
		r.log.Warn("kscope: a retry topic the failure policy no longer uses still holds records of this group; consuming it until it is drained", "retry_topic", t, "delay", d)
	}
	opts = append(opts, kgo.ConsumeTopics(topics...))
	var f *consumer.Failures // set before the workers start
	var sess *kgo.GroupTransactSession
	pool = partition.NewPool(partition.PoolConfig[item]{
		Shards: r.cfg.Shards,
		Process: func(ctx context.Context, _ *partition.Assignment, batch []item) {
			for _, it := range batch {
				r.handle(ctx, sess, f, g, it)
			}
		},
	})
	sess, err = kgo.NewGroupTransactSession(opts...)
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
	f = consumer.NewFailures(r.cfg, cl, r.log)
	pool.Start()
	defer pool.Stop()
	defer g.close() // before pool.Stop: no worker waits to join any more
	holds := newHolds(delays)
	lag := newLagState(obs)

	r.log.Info("kscope: transactional runner started", "topics", r.cfg.Topics, "transactional_id", r.o.TransactionalID,
		"retry_topics", retryTopics, "versions", r.vs != nil)
	if err := sess.Begin(); err != nil {
		return fmt.Errorf("kscope: beginning a transaction: %w", err)
	}
	g.open(&txnState{})
	for {
		// Sleep in the poll no longer than until the open transaction
		// ends, a held partition is due or a parked record times out.
		// The wake-up is registered first, so that a worker joining the
		// transaction, or partitions assigned, after the deadline is
		// computed still end the poll.
		base, cancel := context.WithCancel(ctx)
		g.setKick(cancel)
		if r.vs != nil {
			r.vs.setKick(cancel)
		}
		now := time.Now()
		wake := holds.resume(cl, now)
		soon := func(at time.Time) {
			if !at.IsZero() && (wake.IsZero() || at.Before(wake)) {
				wake = at
			}
		}
		soon(g.endAt(r.o.CommitInterval))
		if r.vs != nil {
			soon(r.vs.nextExpiry())
		}
		if ctx.Err() == nil && (wake.IsZero() || wake.After(now)) {
			pctx, stop := base, context.CancelFunc(func() {})
			if !wake.IsZero() {
				pctx, stop = context.WithDeadline(base, wake)
			}
			if room := r.o.MaxRecords - int(backlogs.Load()); room > 0 {
				fetches := sess.PollRecords(pctx, room)
				stop()
				if fetches.IsClientClosed() {
					cancel()
					break
				}
				r.logFetchErrors(fetches)
				lag.fetched(obs, fetches)
				if r.vs != nil && ctx.Err() == nil {
					// A partition assigned again may have changelog
					// writes in the open transaction (which then
					// aborts): end it before restoring, which waits
					// until no transaction is open on the changelog.
					if len(r.vs.missing(r.cfg.Topics)) > 0 && !g.endAt(r.o.CommitInterval).IsZero() {
						if err := r.endTxn(ctx, sess, g, owned, lag, obs, false); err != nil {
							cancel()
							return err
						}
					}
					if err := r.restore(ctx); err != nil {
						cancel()
						break // ctx is done
					}
				}
				now := time.Now()
				fetches.EachRecord(func(rec *kgo.Record) {
					if holds.keep(cl, rec, now) {
						r.statsMu.Lock()
						r.c.held.Add(1)
						r.statsMu.Unlock()
						return
					}
					if st := owned.get(tp{rec.Topic, rec.Partition}); st != nil {
						st.deliver(rec)
					}
				})
				holds.rewind(cl)
			} else {
				<-pctx.Done() // the backlogs are full: wait for the transaction to end
				stop()
			}
		}
		g.setKick(nil)
		if r.vs != nil {
			r.vs.setKick(nil)
		}
		cancel()
		if r.vs != nil && ctx.Err() == nil {
			for _, p := range r.vs.takeExpired(time.Now()) {
				st := owned.get(tp{p.Topic, p.Partition})
				if st == nil {
					continue
				}
				shard := partition.Shard(p.Topic, p.Partition, p.Offset, p.Key, r.cfg.Shards, r.cfg.NullKeys)
				st.mu.Lock()
				epoch := st.epoch
				st.mu.Unlock()
				pool.Dispatch(shard, st.a, item{part: st, epoch: epoch, expire: p})
			}
		}
		at := g.endAt(r.o.CommitInterval)
		stopping := ctx.Err() != nil
		if !stopping && (at.IsZero() || time.Now().Before(at)) {
			continue
		}
		if err := r.endTxn(ctx, sess, g, owned, lag, obs, stopping); err != nil {
			return err
		}
		if stopping {
			break
		}
	}
	r.log.Info("kscope: transactional runner stopped")
	return nil
}

// endTxn ends the open transaction: it commits what the workers added to
// it with the partitions' offsets, or aborts it and rewinds the
// partitions, and, unless the runner stops, begins the next one.
func (r *Runner) endTxn(ctx context.Context, sess *kgo.GroupTransactSession, g *gate, owned *parts, lag *lagState, obs *consumer.Observer, stopping bool) error {
	cl := sess.Client()
	tx := g.shut()
	if stopping {
		g.close()
	}
	tx.wg.Wait()
	if tx.first.IsZero() && !stopping {
		g.open(tx) // nothing joined: the transaction stays open
		return nil
	}
	open := func() time.Duration {
		if tx.first.IsZero() {
			return 0
		}
		return time.Since(tx.first)
	}
	try := kgo.TryCommit
	if err := tx.failed(); errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		sess.End(context.WithoutCancel(ctx), kgo.TryAbort) //nolint:errcheck // fenced: nothing of ours can commit
		return r.fenced(err, open())
	}
	if err := tx.failed(); err != nil {
		try = kgo.TryAbort
		r.log.Warn("kscope: aborting the transaction; its records are consumed again", "err", err)
	}
	endCtx, installed := owned.commitOffsets(context.WithoutCancel(ctx))
	endCtx, cancel := context.WithTimeout(endCtx, r.o.TransactionTimeout)
	committed, err := sess.End(endCtx, try)
	if err != nil && r.recovered(endCtx, sess, err) {
		committed, err = false, nil
	}
	cancel()
	if err != nil {
		if terr := r.timedOut(open(), err); terr != nil {
			return terr
		}
		if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
			return r.fenced(err, open())
		}
		return fmt.Errorf("kscope: ending the transaction (transactional id %s): %w", r.o.TransactionalID, err)
	}
	if committed {
		installed()
	} else {
		owned.rewind(cl)
	}
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
	if committed {
		r.committed.Add(1)
		r.c.add(&tx.counters)
	} else {
		r.aborts.Add(1)
	}
	r.statsMu.Unlock()
	if stopping {
		return nil
	}
	if err := sess.Begin(); err != nil {
		if terr := r.timedOut(open(), err); terr != nil {
			return terr
		}
		return fmt.Errorf("kscope: beginning a transaction: %w", err)
	}
	g.open(&txnState{})
	return nil
}

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
	if err := consumer.EnsureFailureTopics(ctx, r.cfg, retryTopics); err != nil {
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

// handle runs one work item on its key-shard worker and, once it is
// finished, adds what it produced to the open transaction.
func (r *Runner) handle(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, g *gate, it item) {
	w := &work{part: it.part, epoch: it.epoch}
	if w.stale(ctx) {
		return
	}
	obs := f.Observer()
	switch {
	case it.expire != nil:
		r.expire(ctx, sess, f, w, it.expire)
	case r.vs != nil && it.rec.Key != nil:
		r.handleVersioned(ctx, sess, f, w, it.rec)
	default:
		hctx := obs.Start(ctx, it.rec)
		out, err := r.run(ctx, hctx, sess, f, w, it.rec)
		if out == consumer.OutcomeAborted {
			obs.End(it.rec, out, err)
			return
		}
		w.do(func(tx *txnState) {
			tx.records.Add(1)
			tx.end(obs, it.rec, out, err)
		})
	}
	if w.stopped {
		return
	}
	tx := g.join(it.part, it.epoch)
	if tx == nil {
		if it.rec != nil {
			obs.End(it.rec, consumer.OutcomeAborted, nil)
		}
		return
	}
	for _, fx := range w.fx {
		fx(tx)
	}
	if it.rec != nil {
		it.part.done(it.epoch, it.rec.Offset)
	}
	g.leave(tx, it.rec != nil)
}

// run runs rec's handler with in-place retries and collects its outputs,
// or its route, into w. hctx is the handler's context. The waits between
// attempts hold the record's key-shard, not a transaction. It returns the
// delivery's outcome (success, skipped, retried, dead_lettered, or aborted
// when the runner stops or the record is no longer wanted) and the last
// handler error.
func (r *Runner) run(ctx, hctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, w *work, rec *consumer.Record) (consumer.Outcome, error) {
	var first time.Time
	obs := f.Observer()
	for attempt := 1; ; attempt++ {
		if w.stale(ctx) {
			return consumer.OutcomeAborted, nil
		}
		em := &emitter{}
		err := callHandler(hctx, r.h, rec, em)
		if err == nil {
			for _, out := range em.out {
				obs.Inject(hctx, out)
				what := fmt.Sprintf("an output of %s[%d]@%d", rec.Topic, rec.Partition, rec.Offset)
				w.do(func(tx *txnState) {
					tx.outputs.Add(1)
					tx.produce(ctx, sess, out, what)
				})
			}
			return consumer.OutcomeSuccess, nil
		}
		if w.stale(ctx) {
			return consumer.OutcomeAborted, err
		}
		if first.IsZero() {
			first = time.Now()
		}
		step := f.Decide(ctx, rec, err, attempt, r.retryTopics())
		switch step.Action {
		case retrytopic.ActionRetry:
			f.Route(ctx, rec, err, step, attempt, first) //nolint:errcheck // logs and counts only
			if !backoff.Sleep(w.part.a.Context(), step.Delay) {
				return consumer.OutcomeAborted, err
			}
			continue
		case retrytopic.ActionSkip:
			f.Route(ctx, rec, err, step, attempt, first) //nolint:errcheck // logs and counts only
			w.do(func(tx *txnState) { tx.skipped.Add(1) })
			return consumer.OutcomeSkipped, err
		case retrytopic.ActionRetryTopic:
			// The retry record joins the transaction: it becomes visible
			// exactly when the input's offset commits.
			out := f.RetryTopicRecord(rec, err, step, attempt, first)
			r.route(ctx, sess, f, w, rec, out, "retry", step.Class.String())
			w.do(func(tx *txnState) { tx.retryTopic.Add(1) })
			obs.Event(rec, consumer.EventRetryTopic, out.Topic)
			r.log.Warn("kscope: record sent to a retry topic (in the transaction)",
				"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "retry_topic", out.Topic, "delay", step.Delay, "err", err)
			return consumer.OutcomeRetried, err
		default:
			r.deadLetter(ctx, sess, f, w, rec, err, step, attempt, first)
			return consumer.OutcomeDeadLettered, err
		}
	}
}

// deadLetter adds rec's dead-letter record to w: it becomes visible
// exactly when the input's offset commits.
func (r *Runner) deadLetter(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, w *work, rec *consumer.Record, err error, step retrytopic.Step, attempt int, first time.Time) {
	dl := f.DeadLetterRecord(rec, err, step, attempt, first)
	r.route(ctx, sess, f, w, rec, dl, "dlt", step.Class.String())
	w.do(func(tx *txnState) { tx.dead.Add(1) })
	f.Observer().Event(rec, consumer.EventDeadLetter, dl.Topic)
	r.log.Error("kscope: record sent to the dead-letter topic (in the transaction)",
		"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "class", step.Class.String(), "err", err)
}

// route adds a retry or dead-letter record to w.
func (r *Runner) route(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, w *work, rec *consumer.Record, out *kgo.Record, kind, class string) {
	obs := f.Observer()
	w.do(func(tx *txnState) {
		tx.wg.Add(1)
		sess.Produce(ctx, out, func(_ *kgo.Record, err error) {
			obs.Route(consumer.Route{Topic: rec.Topic, Kind: kind, Class: class, Target: out.Topic, Err: err})
			if err != nil {
				tx.fail(produceError(out.Topic, fmt.Sprintf("the %s record of %s[%d]@%d", kind, rec.Topic, rec.Partition, rec.Offset), err))
			}
			tx.wg.Done()
		})
	})
}

// handleVersioned checks rec's version against its key's last applied one
// and applies, skips, parks or dead-letters it. The key's state changes
// when w joins a transaction; until then only this key-shard's worker
// reads it.
func (r *Runner) handleVersioned(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, w *work, rec *consumer.Record) {
	vers := r.vs.cfg
	obs := f.Observer()
	hctx := obs.Start(ctx, rec)
	now := time.Now()
	ended := func(out consumer.Outcome, err error) {
		w.do(func(tx *txnState) {
			tx.records.Add(1)
			tx.end(obs, rec, out, err)
		})
	}
	v, err := vers.Version(rec)
	if err != nil {
		herr := consumer.DecodeError(err) // poison: the DLT, with the reason
		r.deadLetter(ctx, sess, f, w, rec, herr, f.Decide(ctx, rec, herr, 1, false), 1, now)
		ended(consumer.OutcomeDeadLettered, herr)
		return
	}
	pv := r.vs.get(tp{rec.Topic, rec.Partition})
	if pv == nil {
		w.stopped = true // no longer assigned to this member
		obs.End(rec, consumer.OutcomeAborted, nil)
		return
	}
	key := string(rec.Key)
	last, known := pv.lastOf(key)
	check := vers.Check(v, last, known)
	switch {
	case check.Outcome == sequence.Stale:
		w.do(func(tx *txnState) { tx.stale.Add(1) })
		ended(consumer.OutcomeStale, nil)
		return
	case check.Outcome == sequence.Gap && vers.Gaps == sequence.DeadLetter:
		gap := &retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}
		obs.Event(rec, consumer.EventVersionGap, gap.Error())
		herr := consumer.Terminal(gap)
		r.deadLetter(ctx, sess, f, w, rec, herr, f.Decide(ctx, rec, herr, 1, false), 1, now)
		ended(consumer.OutcomeDeadLettered, herr)
		return
	case check.Outcome == sequence.Gap && vers.Gaps == sequence.Wait:
		obs.Event(rec, consumer.EventVersionGap, (&retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}).Error())
		if pv.parkedAt(key, v) == nil { // a redelivery of a parked record stays parked as it was
			p := &parkedRec{Version: v, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Timestamp: rec.Timestamp,
				Key: rec.Key, Value: rec.Value, Headers: rec.Headers, Since: now}
			val, err := json.Marshal(p)
			if err != nil {
				w.do(func(tx *txnState) {
					tx.fail(fmt.Errorf("encoding the parked record of %s[%d]@%d: %w", rec.Topic, rec.Partition, rec.Offset, err))
				})
				return
			}
			w.do(func(tx *txnState) {
				pv.setParked(key, v, p)
				tx.gapsDetected.Add(1)
			})
			r.changelog(ctx, sess, w, rec.Topic, rec.Partition, parkedKey(rec.Key, v), val)
		}
		ended(consumer.OutcomeGap, nil)
		return
	case check.Outcome == sequence.Gap:
		obs.Event(rec, consumer.EventVersionGap, (&retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}).Error())
	}
	out, herr := r.run(ctx, sequence.WithResult(hctx, check), sess, f, w, rec)
	if out == consumer.OutcomeAborted {
		obs.End(rec, out, herr)
		return
	}
	ended(out, herr)
	if out != consumer.OutcomeSuccess && out != consumer.OutcomeSkipped {
		return // dead-lettered: the key's version stays
	}
	if check.Outcome == sequence.Gap {
		w.do(func(tx *txnState) { tx.gapsAccepted.Add(1) })
	}
	r.advance(ctx, sess, w, pv, rec, v)
	r.releaseParked(ctx, sess, f, w, pv, rec, v)
}

// advance records v as the last applied version of rec's key.
func (r *Runner) advance(ctx context.Context, sess *kgo.GroupTransactSession, w *work, pv *partVersions, rec *consumer.Record, v int64) {
	key := string(rec.Key)
	w.do(func(*txnState) { pv.setLast(key, v) })
	r.changelog(ctx, sess, w, rec.Topic, rec.Partition, append([]byte{kindVersion}, rec.Key...), []byte(strconv.FormatInt(v, 10)))
}

// releaseParked applies the parked records of rec's key that follow v, in
// version order, in the transaction rec joins.
func (r *Runner) releaseParked(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, w *work, pv *partVersions, rec *consumer.Record, v int64) {
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
		out, herr := r.run(ctx, sequence.WithResult(hctx, check), sess, f, w, pr)
		if out == consumer.OutcomeAborted {
			obs.End(pr, out, herr)
			return
		}
		r.unpark(ctx, sess, w, pv, p)
		w.do(func(tx *txnState) { tx.end(obs, pr, out, herr) })
		if out != consumer.OutcomeSuccess && out != consumer.OutcomeSkipped {
			return
		}
		w.do(func(tx *txnState) { tx.gapsHealed.Add(1) })
		v++
		r.advance(ctx, sess, w, pv, pr, v)
	}
}

// expire sends a parked record that waited past GapTimeout to the DLT.
func (r *Runner) expire(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, w *work, p *parkedRec) {
	defer r.vs.expiring(p, false)
	pv := r.vs.get(tp{p.Topic, p.Partition})
	if pv == nil {
		w.stopped = true
		return
	}
	key := string(p.Key)
	if pv.parkedAt(key, p.Version) == nil {
		w.stopped = true // released meanwhile
		return
	}
	last, _ := pv.lastOf(key)
	rec := p.record()
	obs := f.Observer()
	obs.Start(ctx, rec)
	herr := consumer.Terminal(&retrytopic.VersionGapError{Expected: last + 1, Actual: p.Version})
	step := f.Decide(ctx, rec, herr, 1, false)
	r.deadLetter(ctx, sess, f, w, rec, herr, step, 1, p.Since)
	r.unpark(ctx, sess, w, pv, p)
	w.do(func(tx *txnState) {
		tx.timedOut.Add(1)
		tx.end(obs, rec, consumer.OutcomeDeadLettered, herr)
	})
}

func (r *Runner) unpark(ctx context.Context, sess *kgo.GroupTransactSession, w *work, pv *partVersions, p *parkedRec) {
	key := string(p.Key)
	w.do(func(*txnState) { pv.setParked(key, p.Version, nil) })
	r.changelog(ctx, sess, w, p.Topic, p.Partition, parkedKey(p.Key, p.Version), nil)
}

// changelog adds one changelog record to w, to the partition of the input
// partition it belongs to.
func (r *Runner) changelog(ctx context.Context, sess *kgo.GroupTransactSession, w *work, topic string, p int32, key, value []byte) {
	rec := &kgo.Record{Topic: VersionsTopic(r.cfg.Group, topic), Partition: p, Key: key, Value: value}
	w.do(func(tx *txnState) { tx.produce(ctx, sess, rec, "a version changelog record") })
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
