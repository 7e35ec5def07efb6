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
// record both dead-lettered and processed, or lost.
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
// again. Delayed retry topics and version-gap detection are not part of
// this scope yet: failures retry in place, then go to the dead-letter
// topic.
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

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/lifecycle"
	"github.com/kscope-dev/kscope/partition"
	"github.com/kscope-dev/kscope/retrytopic"
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
}

// Runner runs a Kafka-scope pipeline. Build it with [New], Run it, Close it.
type Runner struct {
	cfg consumer.Config
	o   Options
	h   Handler
	log *slog.Logger

	life lifecycle.State

	records, outputs, committed, aborted, dead, skipped atomic.Int64
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
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Runner{cfg: cfg, o: o, h: h, log: cfg.Logger.With("group", cfg.Group, "scope", "kafka")}, nil
}

type nopScope struct{}

func (nopScope) Process(context.Context, []*consumer.Record, func(*consumer.Record)) {}

// Stats returns the runner's counters.
func (r *Runner) Stats() Stats {
	return Stats{
		Records: r.records.Load(), Outputs: r.outputs.Load(), Committed: r.committed.Load(),
		Aborted: r.aborted.Load(), DeadLettered: r.dead.Load(), Skipped: r.skipped.Load(),
	}
}

// Close stops a running Run and waits for it; idempotent.
func (r *Runner) Close() error { return r.life.Close() }

// emitter buffers one record's outputs.
type emitter struct{ out []*kgo.Record }

func (e *emitter) Emit(r *kgo.Record) { e.out = append(e.out, r) }

// txnState is one transaction's bookkeeping, shared by the workers.
type txnState struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	err     error // the first produce or routing failure: the transaction aborts
	outputs atomic.Int64
	records atomic.Int64
	dead    atomic.Int64
	skipped atomic.Int64
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

type item struct {
	rec *consumer.Record
	tx  *txnState
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

	opts := []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer())}
	opts = append(opts, r.cfg.ClientOptions...)
	opts = append(opts,
		kgo.SeedBrokers(r.cfg.Brokers...),
		kgo.ConsumerGroup(r.cfg.Group),
		kgo.ConsumeTopics(r.cfg.Topics...),
		kgo.TransactionalID(r.o.TransactionalID),
		kgo.TransactionTimeout(r.o.TransactionTimeout),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RebalanceTimeout(r.cfg.RebalanceTimeout),
		kgo.FetchMaxWait(min(500*time.Millisecond, r.o.CommitInterval*5)),
	)
	if err := ensureDLT(ctx, r.cfg); err != nil {
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
	f := consumer.NewFailures(r.cfg, sess.Client(), r.log)

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

	r.log.Info("kscope: transactional runner started", "topics", r.cfg.Topics, "transactional_id", r.o.TransactionalID)
	for ctx.Err() == nil {
		fetches := sess.PollRecords(ctx, r.o.MaxRecords)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fetches.EachError(func(t string, p int32, err error) {
			r.log.Warn("kscope: fetch error; the client retries", "topic", t, "partition", p, "err", err)
		})
		if fetches.NumRecords() == 0 {
			continue
		}
		if err := sess.Begin(); err != nil {
			return fmt.Errorf("kscope: beginning a transaction: %w", err)
		}
		tx := &txnState{}
		deadline := time.Now().Add(r.o.CommitInterval)
		n := 0
		dispatch := func(fs kgo.Fetches) {
			fs.EachRecord(func(rec *kgo.Record) {
				n++
				tx.wg.Add(1)
				shard := partition.Shard(rec.Topic, rec.Partition, rec.Offset, rec.Key, r.cfg.Shards, r.cfg.NullKeys)
				pool.Dispatch(shard, assignment(rec.Topic, rec.Partition), item{rec: &consumer.Record{Record: rec}, tx: tx})
			})
		}
		dispatch(fetches)
		// Collect more records into this transaction until the interval
		// or the record bound says to end it.
		for n < r.o.MaxRecords && time.Now().Before(deadline) && ctx.Err() == nil {
			pctx, cancel := context.WithDeadline(ctx, deadline)
			more := sess.PollRecords(pctx, r.o.MaxRecords-n)
			cancel()
			if more.IsClientClosed() {
				break
			}
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
		endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.TransactionTimeout)
		committed, err := sess.End(endCtx, try)
		if err != nil && r.recovered(endCtx, sess, err) {
			committed, err = false, nil
		}
		cancel()
		if err != nil {
			return fmt.Errorf("kscope: ending the transaction (transactional id %s): %w", r.o.TransactionalID, err)
		}
		if committed {
			r.committed.Add(1)
			r.records.Add(tx.records.Load())
			r.outputs.Add(tx.outputs.Load())
			r.dead.Add(tx.dead.Load())
			r.skipped.Add(tx.skipped.Load())
		} else {
			r.aborted.Add(1)
		}
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

// handle runs one input record: the handler with in-place retries, then its
// outputs, or its dead-letter record, produced into the transaction.
func (r *Runner) handle(ctx context.Context, sess *kgo.GroupTransactSession, f *consumer.Failures, it item) {
	rec := it.rec
	var first time.Time
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil || it.tx.failed() != nil {
			return
		}
		em := &emitter{}
		err := callHandler(ctx, r.h, rec, em)
		if err == nil {
			for _, out := range em.out {
				it.tx.outputs.Add(1)
				it.tx.wg.Add(1)
				sess.Produce(ctx, out, func(_ *kgo.Record, err error) {
					if err != nil {
						it.tx.fail(fmt.Errorf("producing an output of %s[%d]@%d: %w", rec.Topic, rec.Partition, rec.Offset, err))
					}
					it.tx.wg.Done()
				})
			}
			it.tx.records.Add(1)
			return
		}
		if first.IsZero() {
			first = time.Now()
		}
		step := f.Decide(ctx, rec, err, attempt, false)
		switch step.Action {
		case retrytopic.ActionRetry:
			f.Route(ctx, rec, err, step, attempt, first) //nolint:errcheck // logs and counts only
			if !backoff.Sleep(ctx, step.Delay) {
				return
			}
			continue
		case retrytopic.ActionSkip:
			f.Route(ctx, rec, err, step, attempt, first) //nolint:errcheck // logs and counts only
			it.tx.skipped.Add(1)
			it.tx.records.Add(1)
			return
		default:
			// The dead-letter record joins the transaction: it becomes
			// visible exactly when the input's offset commits.
			dl := f.DeadLetterRecord(rec, err, step, attempt, first)
			it.tx.wg.Add(1)
			sess.Produce(ctx, dl, func(_ *kgo.Record, err error) {
				if err != nil {
					it.tx.fail(fmt.Errorf("producing the dead-letter record of %s[%d]@%d: %w", rec.Topic, rec.Partition, rec.Offset, err))
				}
				it.tx.wg.Done()
			})
			it.tx.dead.Add(1)
			it.tx.records.Add(1)
			r.log.Error("kscope: record sent to the dead-letter topic (in the transaction)",
				"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "class", step.Class.String(), "err", err)
			return
		}
	}
}

func callHandler(ctx context.Context, h Handler, r *consumer.Record, out Emitter) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("kscope: handler panicked: %v", p)
		}
	}()
	return h.Handle(ctx, r, out)
}

func ensureDLT(ctx context.Context, cfg consumer.Config) error {
	return consumer.EnsureFailureTopics(ctx, cfg, false)
}
