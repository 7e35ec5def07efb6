package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/internal/lifecycle"
	"github.com/kscope-dev/kscope/partition"
)

// ErrRunnerUsed is returned by Run on a runner that already ran or was
// closed: a runner runs once; build a new one to consume again.
var ErrRunnerUsed = lifecycle.ErrUsed

type tp struct {
	topic     string
	partition int32
}

// partState is the runner's view of one partition assignment.
type partState struct {
	*partition.Assignment
	paused   atomic.Bool  // paused for backpressure
	resumeAt atomic.Int64 // backpressure resumes at this many unfinished records

	holdPaused bool // paused while records wait for their due time; under Runner.pauseMu

	hwm atomic.Int64 // the partition's high watermark at the last fetch (kept when lag hooks observe)

	holdMu    sync.Mutex
	held      []*Record // records waiting for their due time, in offset order
	holdTimer *time.Timer
}

// Stats are a runner's own counters, for tests and health checks. Metrics
// for dashboards come from the observability hooks.
type Stats struct {
	InFlight         int64    // records polled and not yet finished, less those Held
	InFlightBytes    int64    // their key, value and header bytes
	MaxInFlight      int64    // the highest InFlight seen
	MaxInFlightBytes int64    // the highest InFlightBytes seen
	Polled           int64    // records dispatched to key-shards
	Done             int64    // records whose effect is durable
	PausedPartitions int      // partitions paused for backpressure now
	Held             int64    // records of delay topics waiting for their due time now
	RetryLateness    Lateness // how late held records were released
	Pauses           int64    // times a partition was paused for backpressure
	Assigned         int      // partitions assigned now
	Rebalances       int64    // assignments, revocations and losses seen
	LostPartitions   int64    // partitions lost (taken without a revoke)
	Commits          int64    // offset commit requests that succeeded
	CommitErrors     int64    // offset commit requests that failed
	Failures         FailureStats
}

// Runner consumes a group's partitions and hands each record to the
// key-shard worker of its key. Build one with [New] (AtLeastOnce scope) or a
// scope package's constructor, call Run, and Close when done.
type Runner struct {
	cfg   Config
	scope Scope
	log   *slog.Logger

	maxBatch int
	linger   time.Duration
	extra    []kgo.Opt
	delays   map[string]time.Duration // delay topics and the longest delay each may carry

	retryTopics bool // the scope sends failures to the retry topics

	obs       *Observer
	cl        *kgo.Client
	failures  *Failures
	tracker   *commit.Tracker
	committer *commit.Committer
	pool      *partition.Pool[*Record]

	mu    sync.Mutex
	parts map[tp]*partState

	hardCtx    context.Context
	hardCancel context.CancelFunc

	room     chan struct{}
	waiting  atomic.Bool
	shardBuf [][]*Record  // the poll loop's per-shard batches, reused
	doneBufs []*doneBuf   // per shard
	avgSize  atomic.Int64 // running average record size; 0 until one is seen
	pauseMu  sync.Mutex

	inflight, inflightBytes         atomic.Int64
	maxInflight, maxInflightBytes   atomic.Int64
	polled, done, pauses            atomic.Int64
	rebalances, commits, commitErrs atomic.Int64
	lost, held                      atomic.Int64
	lateness                        latenessHist
	paused                          atomic.Int64

	fatalMu sync.Mutex
	fatal   error

	life   lifecycle.State
	stopMu sync.Mutex // guards cl and failures, which exist while Run runs
}

// New returns an AtLeastOnce runner: every record is handled at least once
// and nothing is lost. A record's offset is committed only after its handler
// returned nil, or its failure was routed by Config.Failures: skipped as a
// business outcome, or acknowledged by the dead-letter topic (or, with an
// Unordered policy, a retry topic). Keyed records are retried in place, with
// backoff, blocking only their key-shard, so per-key order holds across
// retries. After a crash or a rebalance, records handled since the last
// commit are handled again.
//
// AtLeastOnce does not deduplicate: a handler with external effects must be
// idempotent on its own, or use the DB or Kafka scope.
func New(cfg Config, h Handler) (*Runner, error) {
	if h == nil {
		return nil, &ConfigError{Field: "Handler", Reason: "is nil; pass the function that handles each record"}
	}
	return newRunner(cfg.withDefaults(), &atLeastOnce{h: h, unordered: cfg.Failures.Unordered})
}

// NewRunner returns a runner for a Scope. It is the building block of the
// scope packages; services call their constructors (or [New]).
func NewRunner(cfg Config, s Scope) (*Runner, error) {
	if s == nil {
		return nil, &ConfigError{Field: "Scope", Reason: "is nil"}
	}
	return newRunner(cfg.withDefaults(), s)
}

func newRunner(cfg Config, s Scope) (*Runner, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Runner{
		cfg:      cfg,
		scope:    s,
		log:      cfg.Logger.With("group", cfg.Group),
		obs:      NewObserver(cfg.Group, cfg.Hooks),
		maxBatch: 1,
		parts:    make(map[tp]*partState),
		room:     make(chan struct{}, 1),
	}
	if b, ok := s.(Batcher); ok {
		r.maxBatch, r.linger = b.BatchLimits()
		if r.maxBatch < 1 {
			r.maxBatch = 1
		}
	}
	if o, ok := s.(ClientOptioner); ok {
		r.extra = o.ClientOptions()
	}
	if d, ok := s.(Delayer); ok {
		r.delays = d.DelayedTopics()
	}
	if u, ok := s.(RetryTopicUser); ok && u.UsesRetryTopics() {
		r.retryTopics = true
		if r.delays == nil {
			r.delays = make(map[string]time.Duration)
		}
		for i, t := range cfg.Failures.RetryTopics() {
			r.delays[t] = cfg.Failures.Ladder[i]
		}
	}
	return r, nil
}

// Config returns the runner's configuration, with defaults filled in.
func (r *Runner) Config() Config { return r.cfg }

// Stats returns a snapshot of the runner's counters.
func (r *Runner) Stats() Stats {
	r.mu.Lock()
	assigned := len(r.parts)
	r.mu.Unlock()
	return Stats{
		InFlight:         r.inflight.Load(),
		InFlightBytes:    r.inflightBytes.Load(),
		MaxInFlight:      r.maxInflight.Load(),
		MaxInFlightBytes: r.maxInflightBytes.Load(),
		Polled:           r.polled.Load(),
		Done:             r.done.Load(),
		PausedPartitions: int(r.paused.Load()),
		Pauses:           r.pauses.Load(),
		Assigned:         assigned,
		Rebalances:       r.rebalances.Load(),
		LostPartitions:   r.lost.Load(),
		Held:             r.held.Load(),
		RetryLateness:    r.lateness.snapshot(),
		Commits:          r.commits.Load(),
		CommitErrors:     r.commitErrs.Load(),
		Failures:         r.failureStats(),
	}
}

func (r *Runner) failureStats() FailureStats {
	r.stopMu.Lock()
	f := r.failures
	r.stopMu.Unlock()
	if f == nil {
		return FailureStats{}
	}
	return f.stats()
}

// Client returns the runner's Kafka client while Run is running, else nil.
// Use it for what kscope does not wrap (metadata, lag queries); do not poll,
// commit or close it.
func (r *Runner) Client() *kgo.Client {
	r.stopMu.Lock()
	defer r.stopMu.Unlock()
	return r.cl
}

// Run joins the group and consumes until ctx is canceled, Close is called,
// or a fatal error occurs (returned). Before it returns it stops feeding
// workers, lets running records finish within DrainTimeout, commits every
// durable offset, leaves the group, and waits for every goroutine it
// started. A canceled ctx is a clean stop: Run then returns nil.
func (r *Runner) Run(ctx context.Context) error {
	runCtx, end, err := r.life.Begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	stop := r.life.Stop
	r.hardCtx, r.hardCancel = context.WithCancel(context.WithoutCancel(ctx))
	defer r.hardCancel()
	if st, ok := r.scope.(Starter); ok {
		if err := st.Start(runCtx); err != nil {
			if runCtx.Err() != nil {
				return nil // stopped while starting: a clean stop
			}
			return err
		}
	}

	r.tracker = commit.NewTracker()
	r.doneBufs = make([]*doneBuf, r.cfg.Shards)
	for i := range r.doneBufs {
		d := &doneBuf{r: r}
		d.fn = d.done
		r.doneBufs[i] = d
	}
	r.pool = partition.NewPool(partition.PoolConfig[*Record]{
		Shards:   r.cfg.Shards,
		BatchMax: r.maxBatch,
		Linger:   r.linger,
		Process:  r.process,
		Drop:     r.drop,
	})

	opts := []kgo.Opt{
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(500 * time.Millisecond),
	}
	opts = append(opts, r.cfg.ClientOptions...)
	opts = append(opts, r.extra...)
	opts = append(opts,
		kgo.SeedBrokers(r.cfg.Brokers...),
		kgo.ConsumerGroup(r.cfg.Group),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.RebalanceTimeout(r.cfg.RebalanceTimeout),
		kgo.OnPartitionsAssigned(r.onAssigned),
		kgo.OnPartitionsRevoked(r.onRevoked),
		kgo.OnPartitionsLost(r.onLost),
	)
	if _, ok := r.scope.(FailureAware); ok {
		// The failure topics exist before the group starts consuming
		// (the retry topics are consumed too).
		if err := r.ensureFailureTopics(runCtx); err != nil {
			if runCtx.Err() != nil {
				return nil // stopped while starting: a clean stop
			}
			return err
		}
	}
	opts = append(opts, kgo.ConsumeTopics(r.topics()...))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kscope: creating the Kafka client: %w", err)
	}
	r.stopMu.Lock()
	r.cl = cl
	r.stopMu.Unlock()
	r.committer = commit.NewCommitter(cl, r.tracker, r.onCommit)
	f := &Failures{policy: r.cfg.Failures, group: r.cfg.Group, identity: r.cfg.Identity, cl: cl, log: r.log, topics: r.retryTopics, obs: r.obs}
	r.stopMu.Lock()
	r.failures = f
	r.stopMu.Unlock()
	if fa, ok := r.scope.(FailureAware); ok {
		fa.UseFailures(f)
	}
	r.pool.Start()

	var bg sync.WaitGroup
	bg.Add(1)
	go func() {
		defer bg.Done()
		r.commitLoop(runCtx)
	}()
	if b, ok := r.scope.(Background); ok {
		bg.Add(1)
		go func() {
			defer bg.Done()
			b.RunBackground(runCtx)
		}()
	}

	r.log.Info("kscope: runner started", "topics", r.cfg.Topics, "shards", r.cfg.Shards)
	r.pollLoop(runCtx)
	stop()
	bg.Wait()

	err = r.shutdown(cl)
	r.stopMu.Lock()
	r.cl = nil
	r.stopMu.Unlock()
	if ferr := r.fatalErr(); ferr != nil {
		return ferr
	}
	return err
}

func (r *Runner) ensureFailureTopics(ctx context.Context) error {
	if err := EnsureFailureTopics(ctx, r.cfg, r.retryTopics); err != nil {
		return err
	}
	left, err := LeftoverRetryTopics(ctx, r.cfg, r.retryTopics)
	if err != nil {
		return err
	}
	for t, d := range left {
		if r.delays == nil {
			r.delays = make(map[string]time.Duration)
		}
		r.delays[t] = d
		r.log.Warn("kscope: a retry topic the failure policy no longer uses still holds records of this group; consuming it until it is drained", "retry_topic", t, "delay", d)
	}
	return nil
}

// topics returns the configured topics and the scope's delay topics.
func (r *Runner) topics() []string {
	ts := append([]string(nil), r.cfg.Topics...)
	for t := range r.delays {
		if !slices.Contains(ts, t) {
			ts = append(ts, t)
		}
	}
	return ts
}

// Close stops a running Run and waits for it to return. It is safe to call
// more than once, concurrently, and on a runner that never ran.
func (r *Runner) Close() error { return r.life.Close() }

func (r *Runner) setFatal(err error) {
	r.fatalMu.Lock()
	if r.fatal == nil {
		r.fatal = err
	}
	r.fatalMu.Unlock()
	r.life.Stop()
}

func (r *Runner) fatalErr() error {
	r.fatalMu.Lock()
	defer r.fatalMu.Unlock()
	return r.fatal
}

func (r *Runner) pollLoop(ctx context.Context) {
	r.shardBuf = make([][]*Record, r.cfg.Shards)
	for ctx.Err() == nil {
		room, _ := r.roomNow()
		if room <= 0 {
			r.waitForRoom(ctx)
			continue
		}
		fetches := r.cl.PollRecords(ctx, int(room))
		if fetches.IsClientClosed() {
			return
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			if isFatal(err) {
				r.setFatal(fmt.Errorf("kscope: consuming %s[%d]: %w", topic, p, err))
				return
			}
			r.log.Warn("kscope: fetch error; the client retries", "topic", topic, "partition", p, "err", err)
		})
		if r.obs.WantsFetch() || r.obs.WantsLag() {
			r.observeFetches(fetches)
		}
		var n, bytes int64
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			pn, pb := r.dispatchAll(p.Topic, p.Partition, p.Records)
			n += pn
			bytes += pb
		})
		if n > 0 {
			if avg := r.avgSize.Load(); avg == 0 {
				r.avgSize.Store(max(bytes/n, 1))
			} else {
				r.avgSize.Store(max((avg*7+bytes/n)/8, 1))
			}
		}
		r.cl.AllowRebalance()
	}
}

// pauseAfter is how long the poll loop waits at the in-flight bound before
// it pauses the busiest partitions. Not polling already stops the client
// from fetching more than the one response per broker it buffers; pausing
// also makes the client drop what it buffered for the paused partitions
// (they are fetched again on resume), so it is kept for a bound that holds
// for longer than a burst.
const pauseAfter = 100 * time.Millisecond

// waitForRoom waits at the in-flight bound until a quarter of the capacity
// is free again (workers signal as they finish), so that polls are not one
// record at a time. If that takes longer than pauseAfter, it pauses the
// busiest partitions, so that the room that frees up goes to the others.
func (r *Runner) waitForRoom(ctx context.Context) {
	r.waiting.Store(true)
	defer r.waiting.Store(false)
	pause := time.NewTimer(pauseAfter)
	defer pause.Stop()
	for ctx.Err() == nil {
		room, capacity := r.roomNow()
		if room >= max(capacity/4, 1) {
			return
		}
		select {
		case <-ctx.Done():
		case <-r.room:
		case <-pause.C:
			r.pauseBusiest(capacity)
		}
	}
}

// isFatal reports whether a fetch error cannot heal by retrying.
func isFatal(err error) bool {
	for _, e := range []error{
		kerr.TopicAuthorizationFailed, kerr.GroupAuthorizationFailed,
		kerr.ClusterAuthorizationFailed, kerr.SaslAuthenticationFailed,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (r *Runner) state(topic string, p int32) *partState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.parts[tp{topic, p}]
}

// dispatchAll hands one poll's records of one partition, in offset order, to
// their key-shards. The per-record work is kept to the routing itself: the
// records join the partition's watermark under one lock, are allocated in
// one block, and reach each shard's queue under one lock per shard. It
// returns how many records and bytes the poll held (dispatched or not).
func (r *Runner) dispatchAll(topic string, part int32, recs []*kgo.Record) (n, bytes int64) {
	n = int64(len(recs))
	st := r.state(topic, part)
	if st == nil || st.Revoked() {
		// Not ours (any more): the owner consumes them.
		for _, rec := range recs {
			bytes += recordSize(rec)
		}
		return n, bytes
	}
	var first int
	if r.obs.WantsLag() {
		first = st.Watermark.AddAll(len(recs), func(i int) (int64, int32, int64) {
			return recs[i].Offset, recs[i].LeaderEpoch, recs[i].Timestamp.UnixMilli()
		})
	} else {
		first = st.Watermark.AddAll(len(recs), func(i int) (int64, int32, int64) {
			return recs[i].Offset, recs[i].LeaderEpoch, 0
		})
	}
	for _, rec := range recs[:first] {
		bytes += recordSize(rec)
	}
	recs = recs[first:]
	if len(recs) == 0 {
		return n, bytes
	}
	// One block for the poll's records of this partition: one allocation
	// instead of one per record.
	block := make([]Record, len(recs))
	_, delayed := r.delays[topic]
	th := partition.HashTopic(topic)
	var added int64
	for i, rec := range recs {
		kr := &block[i]
		size := recordSize(rec)
		added += size
		*kr = Record{Record: rec, part: st, size: size, shard: int32(th.Shard(rec.Partition, rec.Offset, rec.Key, r.cfg.Shards, r.cfg.NullKeys))}
	}
	bytes += added
	storeMax(&r.maxInflight, r.inflight.Add(int64(len(recs))))
	storeMax(&r.maxInflightBytes, r.inflightBytes.Add(added))
	r.polled.Add(int64(len(recs)))
	for i := range block {
		kr := &block[i]
		if delayed && r.hold(st, kr) {
			continue
		}
		r.shardBuf[kr.shard] = append(r.shardBuf[kr.shard], kr)
	}
	for shard, q := range r.shardBuf {
		if len(q) == 0 {
			continue
		}
		r.pool.DispatchAll(shard, st.Assignment, q)
		clear(q)
		r.shardBuf[shard] = q[:0]
	}
	return n, bytes
}

// observeFetches reports a poll's records per partition and keeps each
// partition's high watermark for the lag hooks.
func (r *Runner) observeFetches(fs kgo.Fetches) {
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) > 0 {
			r.obs.Fetched(p.Topic, p.Partition, len(p.Records))
		}
		if p.HighWatermark > 0 {
			if st := r.state(p.Topic, p.Partition); st != nil {
				st.hwm.Store(p.HighWatermark)
			}
		}
	})
}

// reportLag reports every assigned partition's lag to the lag hooks.
func (r *Runner) reportLag() {
	r.mu.Lock()
	sts := make([]*partState, 0, len(r.parts))
	for _, st := range r.parts {
		sts = append(sts, st)
	}
	r.mu.Unlock()
	now := time.Now()
	r.pauseMu.Lock()
	paused := make(map[*partState]bool, len(sts))
	for _, st := range sts {
		paused[st] = st.paused.Load() || st.holdPaused
	}
	r.pauseMu.Unlock()
	for _, st := range sts {
		next, ts, pending, ok := st.Watermark.Position()
		hwm := st.hwm.Load()
		if !ok && hwm == 0 {
			continue // nothing fetched yet: the position is not known
		}
		l := Lag{Topic: st.Topic, Partition: st.Partition, InFlight: pending, Paused: paused[st]}
		if ok {
			l.Offsets = max(hwm-next, 0)
		} else {
			l.Offsets = hwm
		}
		if ts > 0 {
			l.Age = max(now.Sub(time.UnixMilli(ts)), 0)
		}
		r.obs.Lag(l)
	}
}

func storeMax(m *atomic.Int64, v int64) {
	for {
		cur := m.Load()
		if v <= cur || m.CompareAndSwap(cur, v) {
			return
		}
	}
}

// doneBuf coalesces the done reports of one key-shard's batches, to hand
// them to the partition's watermark under one lock: when it holds a
// worker batch's worth, when the batch returns, when the scope asks
// (done(nil), before it waits), and before every offset commit, so that a
// commit never misses a record a scope reported done.
type doneBuf struct {
	r       *Runner
	fn      func(*Record) // d.done, bound once
	mu      sync.Mutex    // the worker and the commit loop; rarely both
	recs    []*Record
	offsets []int64
}

// done is the callback scopes call once a record's effect is durable.
// done(nil) hands over the reports kept so far at once.
func (d *doneBuf) done(rec *Record) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if rec == nil {
		d.flushLocked()
		return
	}
	if rec.state != recPending {
		return
	}
	rec.state = recFinished
	d.recs = append(d.recs, rec)
	if len(d.recs) >= atLeastOnceBatch {
		d.flushLocked()
	}
}

func (d *doneBuf) flush() {
	d.mu.Lock()
	d.flushLocked()
	d.mu.Unlock()
}

// flushLocked marks the kept records done in their partition's watermark.
func (d *doneBuf) flushLocked() {
	if len(d.recs) == 0 {
		return
	}
	// A batch's records are all of one partition assignment.
	st := d.recs[0].part
	for _, rec := range d.recs {
		d.offsets = append(d.offsets, rec.Offset)
	}
	if n := st.Watermark.DoneAll(d.offsets); n > 0 {
		d.r.done.Add(int64(n))
	}
	clear(d.recs)
	d.recs, d.offsets = d.recs[:0], d.offsets[:0]
	if st.paused.Load() && int64(st.Watermark.Pending()) <= st.resumeAt.Load() {
		d.r.resume(st)
	}
}

// flushDone hands every shard's kept done reports to the watermarks; the
// committer calls it before it reads them.
func (r *Runner) flushDone() {
	for _, d := range r.doneBufs {
		d.flush()
	}
}

// process is the pool's ProcessFunc: it runs the scope over one batch, then
// gives the batch's in-flight room back at once.
func (r *Runner) process(ctx context.Context, a *partition.Assignment, batch []*Record) {
	if len(batch) == 0 {
		return
	}
	d := r.doneBufs[batch[0].shard]
	r.scope.Process(ctx, batch, d.fn)
	d.flush()
	var bytes int64
	for _, rec := range batch {
		bytes += rec.size
		if rec.state == recPending && ctx.Err() == nil && !rec.Revoked() {
			// Left undone while the partition is still ours.
			r.setFatal(fmt.Errorf("kscope: scope %T returned without finishing %s[%d]@%d while the partition is still assigned", r.scope, rec.Topic, rec.Partition, rec.Offset))
		}
		rec.state = recDone
	}
	r.releaseN(int64(len(batch)), bytes)
}

// drop is the pool's DropFunc for records that will never run here.
func (r *Runner) drop(_ *partition.Assignment, rec *Record) {
	if rec.state == recPending {
		r.release(rec)
	}
}

func (r *Runner) release(rec *Record) {
	rec.state = recDone
	r.releaseN(1, rec.size)
}

// releaseN gives back the in-flight room of n records of the given bytes,
// and wakes the poll loop if it waits for room.
func (r *Runner) releaseN(n, bytes int64) {
	r.inflight.Add(-n)
	r.inflightBytes.Add(-bytes)
	if r.waiting.Load() {
		select {
		case r.room <- struct{}{}:
		default:
		}
	}
}

// roomNow returns how many records the next poll may take, and the capacity
// (the bound in records, the byte bound converted at the average record
// size). Until a record size is known, a poll takes one record.
func (r *Runner) roomNow() (room, capacity int64) {
	capacity = int64(r.cfg.MaxInFlightRecords)
	avg := r.avgSize.Load()
	if avg == 0 {
		return min(capacity-r.inflight.Load(), 1), 1
	}
	room = capacity - r.inflight.Load()
	capacity = min(capacity, max(r.cfg.MaxInFlightBytes/avg, 1))
	room = min(room, (r.cfg.MaxInFlightBytes-r.inflightBytes.Load())/avg)
	return room, capacity
}

// pauseBusiest pauses fetching for the partitions that hold more than their
// fair share of the capacity (at least the busiest one), so that the room
// that frees up goes to the others. A paused partition resumes when its
// unfinished records fall to half its share.
func (r *Runner) pauseBusiest(capacity int64) {
	type cand struct {
		st      *partState
		pending int
	}
	r.mu.Lock()
	cs := make([]cand, 0, len(r.parts))
	for _, st := range r.parts {
		cs = append(cs, cand{st, st.Watermark.Pending()})
	}
	r.mu.Unlock()
	if len(cs) == 0 {
		return
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].pending > cs[j].pending })
	share := max(capacity/int64(len(cs)), 1)

	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	toPause := make(map[string][]int32)
	for i, c := range cs {
		if c.pending == 0 || (i > 0 && int64(c.pending) <= share) {
			break
		}
		c.st.resumeAt.Store(share / 2)
		if !c.st.paused.Load() && !c.st.Revoked() {
			c.st.paused.Store(true)
			r.paused.Add(1)
			r.pauses.Add(1)
			toPause[c.st.Topic] = append(toPause[c.st.Topic], c.st.Partition)
		}
	}
	if len(toPause) > 0 {
		r.cl.PauseFetchPartitions(toPause)
		r.log.Debug("kscope: in-flight bound reached; paused fetching", "partitions", toPause, "in_flight", r.inflight.Load())
	}
	// A partition may have finished its work between the count and the
	// pause; do not leave it paused with nothing to wake it.
	for _, c := range cs {
		if c.st.paused.Load() && int64(c.st.Watermark.Pending()) <= c.st.resumeAt.Load() {
			r.resumeLocked(c.st)
		}
	}
}

// resume resumes fetching a partition paused for backpressure. Pausing and
// resuming are serialized, so the client's paused set and the runner's
// flags cannot disagree.
func (r *Runner) resume(st *partState) {
	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	r.resumeLocked(st)
}

func (r *Runner) resumeLocked(st *partState) {
	if st.paused.Load() {
		st.paused.Store(false)
		r.paused.Add(-1)
		if !st.holdPaused {
			r.cl.ResumeFetchPartitions(map[string][]int32{st.Topic: {st.Partition}})
		}
	}
}

// setHoldPaused pauses fetching of a delay-topic partition while its head
// record waits for its due time, and resumes it after, unless backpressure
// still holds it.
func (r *Runner) setHoldPaused(st *partState, on bool) {
	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	if st.holdPaused == on {
		return
	}
	st.holdPaused = on
	tps := map[string][]int32{st.Topic: {st.Partition}}
	switch {
	case on:
		r.cl.PauseFetchPartitions(tps)
	case !st.paused.Load():
		r.cl.ResumeFetchPartitions(tps)
	}
}

func (r *Runner) commitLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.flushDone()
			if err := r.committer.Commit(ctx, nil); err != nil && ctx.Err() == nil {
				r.log.Warn("kscope: offset commit failed; retrying at the next interval", "err", err)
			}
			if r.obs.WantsLag() {
				r.reportLag()
			}
		}
	}
}

func (r *Runner) onCommit(res commit.Result) {
	n := 0
	for _, ps := range res.Offsets {
		n += len(ps)
	}
	r.obs.Commit(n, res.Err)
	if res.Err != nil {
		r.commitErrs.Add(1)
		return
	}
	r.commits.Add(1)
}

func (r *Runner) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	r.rebalances.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	for topic, ps := range assigned {
		for _, p := range ps {
			k := tp{topic, p}
			if old := r.parts[k]; old != nil {
				old.Revoke()
				old.Cancel()
			}
			wm := r.tracker.Assign(topic, p)
			r.parts[k] = &partState{Assignment: partition.NewAssignment(r.hardCtx, wm)}
		}
	}
	r.obs.Rebalance("assigned", count(assigned))
	r.log.Info("kscope: partitions assigned", "partitions", assigned)
}

// detach ends the given assignments in this process: no queued record of them
// starts any more.
func (r *Runner) detach(parts map[string][]int32) []*partState {
	var out []*partState
	r.mu.Lock()
	for topic, ps := range parts {
		for _, p := range ps {
			k := tp{topic, p}
			if st := r.parts[k]; st != nil {
				st.Revoke()
				delete(r.parts, k)
				out = append(out, st)
			}
		}
	}
	r.mu.Unlock()
	for _, st := range out {
		r.pool.Purge(st.Assignment)
		r.dropHeld(st)
		r.obs.Gone(st.Topic, st.Partition)
	}
	return out
}

func count(ps map[string][]int32) int {
	n := 0
	for _, p := range ps {
		n += len(p)
	}
	return n
}

// onRevoked runs with rebalances blocked from the poll loop's side: nothing
// is being dispatched. It drains the revoked partitions' running records
// (bounded by DrainTimeout), commits what is durable, and lets the rebalance
// go on.
func (r *Runner) onRevoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	r.rebalances.Add(1)
	r.obs.Rebalance("revoked", count(revoked))
	sts := r.detach(revoked)
	if len(sts) == 0 {
		return
	}
	r.drain(sts)
	r.flushDone()
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.DrainTimeout)
	if err := r.committer.Commit(ctx, revoked); err != nil {
		r.log.Warn("kscope: committing revoked partitions failed; their next owner will see the uncommitted records again", "err", err)
	}
	cancel()
	r.forget(sts)
	r.log.Info("kscope: partitions revoked", "partitions", revoked)
}

// onLost commits nothing: another member may own the partitions already.
func (r *Runner) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	r.rebalances.Add(1)
	r.obs.Rebalance("lost", count(lost))
	sts := r.detach(lost)
	for _, st := range sts {
		st.Cancel()
	}
	r.lost.Add(int64(len(sts)))
	r.forget(sts)
	r.log.Warn("kscope: partitions lost; nothing committed for them", "partitions", lost)
}

// drain waits, up to DrainTimeout in all, for the running records of sts,
// then cancels the context of those still running.
func (r *Runner) drain(sts []*partState) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.DrainTimeout)
	defer cancel()
	for _, st := range sts {
		if err := st.WaitIdle(ctx); err != nil {
			r.log.Warn("kscope: drain timeout passed with records still running; canceling them",
				"topic", st.Topic, "partition", st.Partition, "running", st.Running(), "drain_timeout", r.cfg.DrainTimeout)
			break
		}
	}
	for _, st := range sts {
		st.Cancel()
	}
}

func (r *Runner) forget(sts []*partState) {
	for _, st := range sts {
		r.tracker.Remove(st.Topic, st.Partition)
		r.resume(st)
		r.setHoldPaused(st, false)
	}
}

// shutdown ends every assignment the way a revoke does, stops the workers and
// leaves the group.
func (r *Runner) shutdown(cl *kgo.Client) error {
	r.mu.Lock()
	all := make(map[string][]int32)
	for k := range r.parts {
		all[k.topic] = append(all[k.topic], k.partition)
	}
	r.mu.Unlock()
	sts := r.detach(all)
	r.drain(sts)

	// drain canceled the context of whatever still runs; a handler that
	// honors its context returns promptly.
	var err error
	stopped := make(chan struct{})
	go func() {
		r.pool.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(r.cfg.DrainTimeout):
		r.hardCancel()
		err = errors.New("kscope: a handler ignored its canceled context for DrainTimeout; Run returns with its goroutine still running")
	}

	r.flushDone()
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.DrainTimeout)
	if cerr := r.committer.Commit(ctx, all); cerr != nil {
		r.log.Warn("kscope: final offset commit failed; the records since the last commit will be handled again", "err", cerr)
	}
	cancel()
	r.forget(sts)
	cl.Close()
	r.log.Info("kscope: runner stopped")
	return err
}
