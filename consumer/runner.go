package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/internal/lifecycle"
	"github.com/kscope-dev/kscope/internal/txnerr"
	"github.com/kscope-dev/kscope/partition"
	"github.com/kscope-dev/kscope/scope"
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

	hwm      atomic.Int64 // the partition's high watermark at the last fetch that returned records (or, for the lag hooks, at the last fetch)
	polledTo atomic.Int64 // one past the last record polled: records wait to be polled while hwm is beyond it

	holdMu    sync.Mutex
	held      []*Record // records waiting for their due time or, in a transactional runner, a dispatch slot; in offset order
	holdTimer *time.Timer
	// A transactional runner's transaction markers polled behind a held
	// record, in offset order: counted done once the held records below
	// them are dispatched (markersPolledLocked).
	heldMarkers []int64

	// A transactional runner's: the records dispatched and not done (at
	// most commit.MaxUndone).
	active atomic.Int64

	bufs []*doneBuf // the runner's, per key-shard (scope.Engine.Handling)
}

// Runner consumes a group's partitions and hands each record to the
// key-shard worker of its key. Build one with [New] (AtLeastOnce scope), a
// scope package's constructor (dbscope.New, txn.New) or [NewScoped] (a scope
// of a service's own, on package scope's contract), call Run, and Close when
// done.
type Runner struct {
	cfg  Config
	unit workScope
	log  *slog.Logger

	maxBatch int
	linger   time.Duration
	extra    []kgo.Opt                // the scope's client options (scope.ClientOptioner)
	defaults []kgo.Opt                // the scope's client defaults (scope.ClientDefaulter)
	delays   map[string]time.Duration // delay topics and the longest delay each may carry

	retryTopics bool // the scope sends failures to the retry topics

	obs       *observer
	cl        *kgo.Client
	failures  *failures
	kb        *keyBreaker // Config.KeyBreaker; nil without it
	tracker   *commit.Tracker
	committer *commit.Committer
	pool      *partition.Pool[*Record]

	mu    sync.Mutex
	parts map[tp]*partState

	hardCtx    context.Context
	hardCancel context.CancelFunc

	room     chan struct{}
	waiting  atomic.Bool
	shardBuf [][]*Record // the poll loop's per-shard batches, reused

	route     []routed // the poll loop's routing scratch (routeBuf)
	routeNext []int
	doneBufs  []*doneBuf   // per shard
	avgSize   atomic.Int64 // running average record size; 0 until one is seen
	pauseMu   pauseState   // serializes pausing and resuming; the user's pauses (pause.go)

	inflight, inflightBytes         atomic.Int64
	maxInflight, maxInflightBytes   atomic.Int64
	polled, done, pauses            atomic.Int64
	rebalances, commits, commitErrs atomic.Int64
	lost, held                      atomic.Int64
	stalled                         atomic.Int64 // key-shards reported stalled now (watchStalls)
	lateness                        latenessHist
	paused                          atomic.Int64

	fatalMu sync.Mutex
	fatal   error

	// A transactional runner's (the scope is a scope.Transactor): its
	// session and the transaction settings.
	txs        scope.Transactor[*Record]
	sess       *kgo.GroupTransactSession
	txnID      string
	txnTimeout time.Duration
	heldDue    atomic.Int64 // delay-topic records held for their due time, ever
	rewinds    int          // aborted transactions' rewinds; the poll loop's
	renewedAt  time.Time    // when Run last started a new session (scope.ErrRenewSession)
	runCtx     context.Context

	life        lifecycle.State
	stopMu      sync.Mutex  // guards cl and failures, which exist while Run runs
	fetchHealth fetchHealth // the poll loop's: fetching failing and recovering

	// What Health reads: Run's state, the poll loop's beat, the brokers
	// answering, and whether the member holds an assignment.
	runHealth runHealth
	loopBeat  loopBeat
	brokers   brokerHealth
	proto     protocolSeen // the group protocol the client uses
	joined    atomic.Bool
	idle      idleWork  // the periodic work's counters (Config.Periodic; idlework.go)
	share     *shareRun // a share group's (Config.Share); nil for a consumer group
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
		return nil, &ConfigError{Struct: "consumer.New's handler", Reason: "is nil; pass the function that handles each record"}
	}
	r, err := newRunner(cfg.WithDefaults(), &atLeastOnce{h: h, unordered: cfg.Failures.Unordered, g: newGuard(cfg.WithDefaults())})
	if err = errors.Join(err, CheckRoutes(cfg, h)); err != nil {
		return nil, err
	}
	return r, nil
}

// NewScoped returns a runner for the unit of work s, with cfg's defaults
// filled in: it is how the DB scope (dbscope.New), the Kafka scope (txn.New)
// and a scope of a service's own plug into the runner. Package scope is the
// contract s implements (scope.Scope and the optional interfaces the runner
// looks for); a handler of the AtLeastOnce scope needs [New] instead.
func NewScoped(cfg Config, s scope.Scope[*Record]) (*Runner, error) {
	if s == nil {
		return nil, &ConfigError{Struct: "consumer.NewScoped's scope", Reason: "is nil; pass the unit of work the runner runs (package scope)"}
	}
	return newRunner(cfg.WithDefaults(), s)
}

func newRunner(cfg Config, s workScope) (*Runner, error) {
	if err := errors.Join(cfg.validate(), checkPeriodic(cfg, s), checkShare(cfg, s)); err != nil {
		return nil, err
	}
	r := &Runner{
		cfg:      cfg,
		unit:     s,
		log:      cfg.Logger.With("group", cfg.Group),
		obs:      newObserver(cfg.Group, cfg.Hooks),
		maxBatch: 1,
		parts:    make(map[tp]*partState),
		room:     make(chan struct{}, 1),
		kb:       newKeyBreaker(cfg),
	}
	if cfg.Share != nil {
		r.share = &shareRun{cfg: *cfg.Share}
	}
	if err := r.useKeyBreaker(s); err != nil {
		return nil, err
	}
	if _, ok := s.(guardedScope); cfg.Dedupe.Store != nil && !ok {
		return nil, &ConfigError{Field: "Dedupe.Store", Reason: fmt.Sprintf("is set for scope %T; only the AtLeastOnce scope (consumer.New, consumer.NewBatch) uses a dedupe store: "+
			"the DB scope's inbox is its guard, the Kafka scope keeps its own in its transactions (txn.Options.Dedupe); leave Dedupe empty", s)}
	}
	if b, ok := s.(scope.Batcher); ok {
		r.maxBatch, r.linger = b.BatchLimits()
		if r.maxBatch < 1 {
			r.maxBatch = 1
		}
	}
	if o, ok := s.(scope.ClientOptioner); ok {
		r.extra = o.ClientOptions()
	}
	if d, ok := s.(scope.ClientDefaulter); ok {
		r.defaults = d.ClientDefaults()
	}
	if d, ok := s.(scope.Delayer); ok {
		r.delays = d.DelayedTopics()
	}
	if t, ok := s.(scope.Transactor[*Record]); ok {
		if len(cfg.TopicPatterns) > 0 {
			return nil, &ConfigError{Field: "TopicPatterns", Reason: "is set for a scope that commits in Kafka transactions (the Kafka scope), which does not support topic patterns; list the topics in Topics instead"}
		}
		r.txs = t
		r.txnID, r.txnTimeout = t.TxnConfig()
	}
	if u, ok := s.(scope.RetryTopicUser); ok && u.UsesRetryTopics() {
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
	st := Stats{
		InFlight:         r.inflight.Load(),
		InFlightBytes:    r.inflightBytes.Load(),
		MaxInFlight:      r.maxInflight.Load(),
		MaxInFlightBytes: r.maxInflightBytes.Load(),
		Polled:           r.polled.Load(),
		Done:             r.done.Load(),
		PausedPartitions: int(r.paused.Load()),
		Pauses:           r.pauses.Load(),
		Assigned:         assigned,
		GroupProtocol:    r.proto.get(),
		Rebalances:       r.rebalances.Load(),
		LostPartitions:   r.lost.Load(),
		Held:             r.held.Load(),
		RetryLateness:    r.lateness.snapshot(),
		Commits:          r.commits.Load(),
		CommitErrors:     r.commitErrs.Load(),
		StalledShards:    int(r.stalled.Load()),
		Failures:         r.failureStats(),
		Hold:             r.holdStats(),
		Periodic:         r.idle.stats(),
		KeyBreaker:       r.kb.stats(),
		Dedupe:           r.dedupeStats(),
	}
	if r.share != nil {
		st.Share = r.share.stats()
	}
	r.callStats(&st)
	if r.txs != nil {
		st.Kafka.Held = r.heldDue.Load()
	}
	if sr, ok := r.unit.(scope.StatsReporter[Stats]); ok {
		sr.ReportStats(&st)
	}
	return st
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

func (r *Runner) holdStats() HoldStats {
	r.stopMu.Lock()
	f := r.failures
	r.stopMu.Unlock()
	if f == nil {
		return HoldStats{}
	}
	return f.hold.stats()
}

// start readies the scope, the key-shard pool and the failure topics (they
// exist before the group starts consuming: the retry topics are consumed
// too), and creates the Kafka client.
func (r *Runner) start(runCtx context.Context) (*kgo.Client, error) {
	if st, ok := r.unit.(scope.Starter); ok {
		if err := st.Start(runCtx); err != nil {
			return nil, err
		}
	}
	r.newPool()
	if usesEngine(r.unit) {
		if err := r.ensureFailureTopics(runCtx); err != nil {
			return nil, err
		}
	}
	r.runCtx = runCtx
	return r.newClient(runCtx)
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
func (r *Runner) Run(ctx context.Context) (err error) {
	runCtx, end, err := r.life.Begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	r.runBegins()
	defer func() { r.runEnds(err) }()
	for {
		err, renew := r.session(ctx, runCtx)
		if renew == nil {
			return err
		}
		r.log.Warn("kscope: the transactional producer cannot go on after a transaction whose end failed; "+
			"starting a new session, which consumes from what the broker committed", "transactional_id", r.txnID, "err", renew)
	}
}

// session runs one client of Run: it creates it, consumes until runCtx
// ends or a fatal error, and shuts it down. A transactional runner whose
// producer cannot go on after a transaction's end failed (see
// scope.ErrRenewSession) reports that error as renew, once the client is shut
// down: Run then starts a new session, as a restart would.
func (r *Runner) session(ctx, runCtx context.Context) (err, renew error) {
	sessCtx, stop := context.WithCancel(runCtx)
	defer stop()
	r.sessionBegins()
	r.hardCtx, r.hardCancel = context.WithCancel(context.WithoutCancel(ctx))
	defer r.hardCancel()
	cl, err := r.start(sessCtx)
	if err != nil {
		if runCtx.Err() != nil {
			return nil, nil // stopped while starting: a clean stop
		}
		return err, nil
	}
	f := r.useClient(cl)
	r.pool.Start()
	bg := r.startBackground(sessCtx)
	r.log.Info("kscope: runner started", "topics", r.cfg.Topics, "topic_patterns", r.cfg.TopicPatterns, "shards", r.cfg.Shards, "transactional_id", r.txnID)
	switch {
	case r.share != nil:
		r.sharePollLoop(sessCtx)
	case r.txs != nil:
		renew = r.txnSession(sessCtx, runCtx)
	default:
		r.pollLoop(sessCtx)
	}
	stop()
	bg.Wait()

	err = r.shutdown(cl)
	f.dltLog.Flush()
	r.stopMu.Lock()
	r.cl = nil
	r.stopMu.Unlock()
	if ferr := r.fatalErr(); ferr != nil {
		return ferr, nil
	}
	if err != nil || runCtx.Err() != nil {
		return err, nil
	}
	return nil, renew
}

// useClient makes cl the session's client: the offset committer of a
// runner that commits on its own, and the session's failures, which the
// scope is handed (scope.EngineUser) before any record is dispatched.
func (r *Runner) useClient(cl *kgo.Client) *failures {
	r.stopMu.Lock()
	r.cl = cl
	r.stopMu.Unlock()
	if r.txs == nil {
		r.committer = commit.NewCommitter(cl, r.tracker, r.onCommit)
	}
	r.stopMu.Lock()
	f := r.failures
	if f == nil {
		f = &failures{policy: r.cfg.Failures, group: r.cfg.Group, identity: r.cfg.Identity, log: r.log, topics: r.retryTopics, obs: r.obs, dltLog: newDLTLog(), calls: newCallRules(r.cfg)}
		r.failures = f
		f.calls.breakers.bind(r)
		f.calls.keys = r.kb
	}
	f.cl = cl
	r.stopMu.Unlock()
	switch u := r.unit.(type) {
	case ownScope:
		u.bind(f)
	case scope.EngineUser[*Record]:
		u.UseEngine(engineOf{f})
	}
	return f
}

// usesEngine reports whether the scope runs its records through the
// runner's failure policy: the package's own scopes, and those that
// implement scope.EngineUser.
func usesEngine(s workScope) bool {
	switch s.(type) {
	case ownScope, scope.EngineUser[*Record]:
		return true
	}
	return false
}

// startBackground starts the session's background work: the offset
// commit loop (unless the runner commits in transactions), the stall
// watch and the scope's own (scope.Background). They stop when ctx ends;
// the caller waits for them.
func (r *Runner) startBackground(ctx context.Context) *sync.WaitGroup {
	var bg sync.WaitGroup
	if r.txs == nil {
		bg.Go(func() { r.commitLoop(ctx) })
	}
	bg.Go(func() { r.watchStalls(ctx) })
	bg.Go(func() { r.runIdleWork(ctx) })
	if b, ok := r.unit.(scope.Background); ok {
		bg.Go(func() { b.RunBackground(ctx) })
	}
	return &bg
}

// txnSession runs a transactional session's loop. An error that needs a
// new session (scope.ErrRenewSession) is returned, unless the runner stops or
// the last renewal was less than renewAfter ago; any other ends the runner.
func (r *Runner) txnSession(sessCtx, runCtx context.Context) (renew error) {
	lerr := r.txnLoop(sessCtx)
	switch {
	case lerr == nil:
		return nil
	case !errors.Is(lerr, scope.ErrRenewSession) || runCtx.Err() != nil:
		r.setFatal(lerr)
	case !r.renewedAt.IsZero() && time.Since(r.renewedAt) < renewAfter:
		r.setFatal(r.renewedTooSoon(lerr))
	default:
		r.renewedAt = time.Now()
		return lerr
	}
	return nil
}

// renewedTooSoon is the error that stops a transactional runner whose
// session, renewed less than renewAfter ago, needs renewing again (err): a
// fence so soon is taken for a real one, from a producer with the same
// transactional id, and wraps txnerr.ErrFenced.
func (r *Runner) renewedTooSoon(err error) error {
	msg := fmt.Sprintf("the transactional session was renewed %s ago and needs renewing again; stopping", time.Since(r.renewedAt).Round(time.Millisecond))
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		return fmt.Errorf("%w: %s: another producer may use transactional id %s; give every member its own (Options.TransactionalID): %w", txnerr.ErrFenced, msg, r.txnID, err)
	}
	return fmt.Errorf("kscope: %s: %w", msg, err)
}

// newPool builds the key-shard workers, the watermark tracker and each
// shard's buffer of finished records.
func (r *Runner) newPool() {
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
}

func (r *Runner) ensureFailureTopics(ctx context.Context) error {
	if err := ensureFailureTopics(ctx, r.cfg, r.retryTopics); err != nil {
		return err
	}
	left, holding, err := leftoverRetryTopics(ctx, r.cfg, r.retryTopics)
	if err != nil {
		return err
	}
	warnEarlierGroups(ctx, r.cfg)
	for t, d := range left {
		if r.delays == nil {
			r.delays = make(map[string]time.Duration)
		}
		r.delays[t] = d
		if holding[t] {
			r.log.Warn("kscope: a retry topic the failure policy no longer uses still holds records of this group; consuming it", "retry_topic", t, "delay", d)
			continue
		}
		r.log.Info("kscope: consuming a retry topic the failure policy no longer uses, as members still running an earlier policy may send records to it; "+
			"delete it once none does and this group has consumed it", "retry_topic", t, "delay", d)
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
