package txn

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/engine"
	"github.com/kscope-dev/kscope/internal/ratelog"
)

type tp struct {
	topic     string
	partition int32
}

// counters are the Kafka-scope counters (consumer.KafkaStats) of one
// transaction, or of the runner.
type counters struct {
	records, outputs, dead, skipped, retryTopic             atomic.Int64
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

// scope is the Kafka scope's unit of work on the runner (an
// engine.Transactor): it runs each record's handler, with in-place
// retries, and adds the outputs, or the record's route, to the runner's
// open transaction; the runner ends the transactions and commits the
// offsets in them.
type scope struct {
	o      Options
	h      Handler
	cfg    consumer.Config
	log    *slog.Logger
	vs     *versionStore // nil without Options.Versions
	dltLog *ratelog.Limiter

	f   engine.Failures // set before the workers start
	obs engine.Observer
	t   engine.Txn

	cur *txnState // the open transaction's; replaced when it ends (no worker is joined then)

	statsMu            sync.Mutex // a transaction's counters join the runner's at once
	c                  counters
	committed, aborted atomic.Int64
}

// init completes the scope with the runner's configuration (defaults
// filled in).
func (s *scope) init(cfg consumer.Config) {
	s.cfg = cfg
	s.log = cfg.Logger.With("group", cfg.Group, "scope", "kafka")
	s.cur = &txnState{}
	if s.o.Versions != nil {
		s.vs = &versionStore{cfg: *s.o.Versions, group: cfg.Group, kcfg: cfg, parts: map[tp]*partVersions{}, owned: map[tp]uint64{}, expiringSet: map[*parkedRec]bool{}}
	}
}

// TxnConfig implements engine.Transactor.
func (s *scope) TxnConfig() (string, time.Duration, time.Duration, int) {
	return s.o.TransactionalID, s.o.CommitInterval, s.o.TransactionTimeout, s.o.MaxRecords
}

// ClientOptions are the transactional producer's settings, the version
// changelog's partitioner, and a fetch wait no longer than a few
// transactions.
func (s *scope) ClientOptions() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.TransactionalID(s.o.TransactionalID),
		kgo.TransactionTimeout(s.o.TransactionTimeout),
		kgo.FetchMaxWait(min(500*time.Millisecond, s.o.CommitInterval*5)),
	}
	if s.vs != nil {
		opts = append(opts, kgo.RecordPartitioner(newChangelogPartitioner(s.cfg.Group, s.cfg.Topics)))
	}
	return opts
}

// BatchLimits: a worker takes the queued records of a partition together;
// each is handled and joins a transaction on its own.
func (s *scope) BatchLimits() (int, time.Duration) { return 64, 0 }

// UsesRetryTopics: failing records go to the delayed retry topics only
// with an Unordered policy (and no versions), as in the AtLeastOnce scope.
func (s *scope) UsesRetryTopics() bool {
	return s.cfg.Failures.Unordered && s.o.Versions == nil && len(s.cfg.Failures.RetryTopics()) > 0
}

// UseFailures implements engine.FailureAware.
func (s *scope) UseFailures(f any) {
	s.f = engine.AsFailures(f)
	s.obs = engine.ObserverOf(s.f)
}

// UseTxn implements engine.Transactor.
func (s *scope) UseTxn(t any) {
	s.t = engine.AsTxn(t)
	if s.vs != nil {
		s.vs.setKick(s.t.Kick)
	}
	s.log.Info("kscope: transactional runner started", "topics", s.cfg.Topics, "transactional_id", s.o.TransactionalID,
		"retry_topics", s.UsesRetryTopics(), "versions", s.vs != nil)
}

// Start creates the version changelogs that are missing.
func (s *scope) Start(ctx context.Context) error {
	if s.vs != nil {
		return ensureChangelogs(ctx, s.cfg)
	}
	return nil
}

// Process handles a batch of one partition's records, one by one.
func (s *scope) Process(ctx context.Context, batch []*consumer.Record, done func(*consumer.Record)) {
	for _, rec := range batch {
		if !s.handle(ctx, rec, done) {
			return // stopped, or the record's assignment ended: its next owner redoes it
		}
	}
}

// TxnFlush waits for the produces of the transaction that ends and
// returns the first that failed.
func (s *scope) TxnFlush() error {
	s.cur.wg.Wait()
	return s.cur.failed()
}

// TxnEnded accounts for the transaction that ended: the version store,
// the records' outcomes and the counters; the next one starts afresh.
func (s *scope) TxnEnded(committed bool) {
	tx := s.cur
	if s.vs != nil {
		s.vs.end(committed)
	}
	tx.finish(s.obs, committed)
	s.statsMu.Lock()
	if committed {
		s.committed.Add(1)
		s.c.add(&tx.counters)
	} else {
		s.aborted.Add(1)
	}
	s.statsMu.Unlock()
	s.cur = &txnState{}
	s.dltLog.Flush()
}

// TxnAssigned notes partitions whose committed offsets were fetched: their
// versions are restored before their records are handled.
func (s *scope) TxnAssigned(ps map[string][]int32) {
	if s.vs != nil {
		s.vs.assigned(ps)
	}
}

// TxnGone forgets the versions of revoked or lost partitions.
func (s *scope) TxnGone(ps map[string][]int32) {
	if s.vs != nil {
		s.vs.drop(ps)
	}
}

// TxnPrepare restores the versions of newly assigned partitions before
// their records are dispatched. A partition assigned again may have
// changelog writes in the open transaction (which then aborts): it is
// ended first, since restoring waits until no transaction is open on the
// changelog.
func (s *scope) TxnPrepare(ctx context.Context) error {
	if s.vs == nil || ctx.Err() != nil || len(s.vs.missing(s.cfg.Topics)) == 0 {
		return nil
	}
	if err := s.t.End(); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		need := s.vs.missing(s.cfg.Topics)
		if len(need) == 0 {
			return nil
		}
		err := s.vs.restore(ctx, need)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return nil // stopping
		}
		d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
		s.log.Warn("kscope: restoring versions from the changelog failed; retrying", "err", err, "retry_in", d)
		if !backoff.Sleep(ctx, d) {
			return nil
		}
	}
}

// TxnTick sends the parked records that waited past GapTimeout to their
// key-shards, which dead-letter them, and returns when the next one times
// out.
func (s *scope) TxnTick(now time.Time) time.Time {
	if s.vs == nil {
		return time.Time{}
	}
	for _, p := range s.vs.takeExpired(now) {
		if !s.t.Schedule(p.Topic, p.Partition, p.Key, func(ctx context.Context, rec *consumer.Record) { s.expire(ctx, rec, p) }) {
			s.vs.expiring(p, false)
		}
	}
	return s.vs.nextExpiry()
}

// ReportStats fills in the Kafka scope's counters; Done counts the input
// records committed, Commits the transactions committed.
func (s *scope) ReportStats(st *consumer.Stats) {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	k := &st.Kafka
	k.Records, k.Outputs, k.Committed = s.c.records.Load(), s.c.outputs.Load(), s.committed.Load()
	k.Aborted, k.DeadLettered, k.Skipped = s.aborted.Load(), s.c.dead.Load(), s.c.skipped.Load()
	k.RetryTopic, k.Stale, k.GapsDetected = s.c.retryTopic.Load(), s.c.stale.Load(), s.c.gapsDetected.Load()
	k.GapsHealed, k.GapsAccepted, k.GapsTimedOut = s.c.gapsHealed.Load(), s.c.gapsAccepted.Load(), s.c.timedOut.Load()
	st.Done, st.Commits = k.Records, k.Committed
}
