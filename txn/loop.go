package txn

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/engine"
	"github.com/kscope-dev/kscope/partition"
)

// Run consumes, transforms and produces until ctx is canceled (then it
// commits what is finished and returns nil) or a fatal error, such as
// being fenced by another producer with the same transactional id
// ([ErrFenced]).
func (r *Runner) Run(ctx context.Context) error {
	ctx, end, err := r.life.Begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	l := r.newLoop(ctx)
	if err := l.prepareTopics(); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: a clean stop
		}
		return err
	}
	l.pool = partition.NewPool(partition.PoolConfig[item]{
		Shards: r.cfg.Shards,
		Process: func(ctx context.Context, _ *partition.Assignment, batch []item) {
			for _, it := range batch {
				r.handle(ctx, l.sess, l.f, l.g, it)
			}
		},
	})
	l.sess, err = kgo.NewGroupTransactSession(l.clientOptions()...)
	if err != nil {
		return fmt.Errorf("kscope: creating the transactional client: %w", err)
	}
	defer l.sess.Close()
	l.cl = l.sess.Client()
	r.clMu.Lock()
	r.cl = l.cl
	r.clMu.Unlock()
	defer func() {
		r.clMu.Lock()
		r.cl = nil
		r.clMu.Unlock()
	}()
	// Initialise the producer ID before the first poll: it fences the
	// previous incarnation of this transactional id and aborts its open
	// transaction. Until then the group's offsets that transaction
	// committed are unstable, and the consumer, which fetches them with
	// RequireStable, would wait for the broker to time it out.
	if _, _, err := l.cl.ProducerID(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("kscope: initialising the producer ID of transactional id %s: %w", r.o.TransactionalID, err)
	}
	l.f = engine.NewFailures(r.cfg, l.cl, r.log)
	l.pool.Start()
	defer l.pool.Stop()
	defer l.g.close() // before pool.Stop: no worker waits to join any more
	l.holds = newHolds(l.delays)
	r.log.Info("kscope: transactional runner started", "topics", r.cfg.Topics, "transactional_id", r.o.TransactionalID,
		"retry_topics", l.retryTopics, "versions", r.vs != nil)
	if err := l.sess.Begin(); err != nil {
		return fmt.Errorf("kscope: beginning a transaction: %w", err)
	}
	l.g.open(&txnState{})
	if err := l.loop(); err != nil {
		return err
	}
	r.dltLog.Flush()
	r.log.Info("kscope: transactional runner stopped")
	return nil
}

// runLoop is one Run: its client, its workers and what they share.
type runLoop struct {
	r        *Runner
	ctx      context.Context
	obs      engine.Observer
	g        *gate
	backlogs atomic.Int64
	owned    *parts
	pool     *partition.Pool[item]
	sess     *kgo.GroupTransactSession
	cl       *kgo.Client
	f        engine.Failures // set before the workers start
	holds    *holds
	lag      *lagState

	retryTopics bool
	topics      []string                 // consumed: the inputs and the retry topics
	delays      map[string]time.Duration // retry topics and the longest delay each may carry
}

func (r *Runner) newLoop(ctx context.Context) *runLoop {
	l := &runLoop{r: r, ctx: ctx, retryTopics: r.retryTopics(), delays: map[string]time.Duration{},
		topics: append([]string(nil), r.cfg.Topics...),
		owned:  &parts{m: map[tp]*partState{}}, g: newGate(r.o.MaxRecords)}
	l.obs = engine.NewObserver(r.cfg.Group, r.cfg.Hooks)
	l.lag = newLagState(l.obs)
	if l.retryTopics {
		for i, t := range r.cfg.Failures.RetryTopics() {
			l.topics = append(l.topics, t)
			l.delays[t] = r.cfg.Failures.Ladder[i]
		}
	}
	return l
}

// prepareTopics creates the failure topics that are missing and adds the
// retry topics the policy no longer names but that still hold records of
// the group: they are drained, as the other scopes drain them.
func (l *runLoop) prepareTopics() error {
	r := l.r
	if err := r.ensureTopics(l.ctx, l.retryTopics); err != nil {
		return err
	}
	left, err := engine.LeftoverRetryTopics(l.ctx, r.cfg, l.retryTopics)
	if err != nil {
		return err
	}
	for t, d := range left {
		l.topics = append(l.topics, t)
		l.delays[t] = d
		r.log.Warn("kscope: a retry topic the failure policy no longer uses still holds records of this group; consuming it until it is drained", "retry_topic", t, "delay", d)
	}
	return nil
}

// clientOptions are the options of the transactional client.
func (l *runLoop) clientOptions() []kgo.Opt {
	r := l.r
	opts := []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer())}
	opts = append(opts, r.cfg.ClientOptions...)
	opts = append(opts,
		kgo.SeedBrokers(r.cfg.Brokers...),
		kgo.ConsumerGroup(r.cfg.Group),
		kgo.ConsumeTopics(l.topics...),
		kgo.TransactionalID(r.o.TransactionalID),
		kgo.TransactionTimeout(r.o.TransactionTimeout),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RebalanceTimeout(r.cfg.RebalanceTimeout),
		kgo.FetchMaxWait(min(500*time.Millisecond, r.o.CommitInterval*5)),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			l.obs.Rebalance("assigned", count(ps))
			r.rebalances.Add(1)
			r.assigned.Add(int64(count(ps)))
		}),
		// The group's offsets of newly assigned partitions are fetched
		// with RequireStable after OnPartitionsAssigned: only then has a
		// previous owner's last transaction ended. Their metadata says
		// which records above the offset are done; the version changelog
		// is restored only then too.
		kgo.OnOffsetsFetched(func(_ context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
			l.offsetsFetched(resp)
			return nil
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) { l.gone("revoked", ps) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) { l.gone("lost", ps) }),
	)
	if r.vs != nil {
		opts = append(opts, kgo.RecordPartitioner(newChangelogPartitioner(r.cfg.Group, r.cfg.Topics)))
	}
	return opts
}

// dispatch sends rec, of partition p, to its key-shard.
func (l *runLoop) dispatch(p *partState, rec *kgo.Record) {
	r := l.r
	it := item{part: p, epoch: p.epoch, rec: &consumer.Record{Record: rec}}
	l.pool.Dispatch(partition.Shard(rec.Topic, rec.Partition, rec.Offset, rec.Key, r.cfg.Shards, r.cfg.NullKeys), p.a, it)
}

// offsetsFetched starts tracking the partitions whose group offsets (and
// their metadata: the records done above the offset) were fetched.
func (l *runLoop) offsetsFetched(resp *kmsg.OffsetFetchResponse) {
	r := l.r
	fetched := fetchedOffsets(resp)
	l.owned.mu.Lock()
	for k, fo := range fetched {
		st := newPartState(k.topic, k.partition, partition.NewAssignment(l.ctx, commit.NewPartition(k.topic, k.partition)), l.dispatch, &l.backlogs)
		if err := st.setCommitted(fo.offset, fo.meta); err != nil {
			r.log.Warn("kscope: the committed offset's metadata is not kscope's; records above the offset are handled again",
				"topic", k.topic, "partition", k.partition, "offset", fo.offset, "err", err)
		}
		if old := l.owned.m[k]; old != nil {
			old.leave()
		}
		l.owned.m[k] = st
	}
	l.owned.mu.Unlock()
	if r.vs != nil {
		ps := map[string][]int32{}
		for k := range fetched {
			ps[k.topic] = append(ps[k.topic], k.partition)
		}
		r.vs.assigned(ps)
	}
}

// gone stops tracking revoked or lost partitions and drops their queued
// records.
func (l *runLoop) gone(kind string, ps map[string][]int32) {
	l.obs.Rebalance(kind, count(ps))
	l.r.rebalances.Add(1)
	l.r.assigned.Add(-int64(count(ps)))
	l.owned.mu.Lock()
	for t, parts := range ps {
		for _, p := range parts {
			l.obs.Gone(t, p)
			if st := l.owned.m[tp{t, p}]; st != nil {
				st.leave()
				l.pool.Purge(st.a)
				delete(l.owned.m, tp{t, p})
			}
		}
	}
	l.owned.mu.Unlock()
	if l.r.vs != nil {
		l.r.vs.drop(ps)
	}
}

// loop polls and ends transactions until the runner stops.
func (l *runLoop) loop() error {
	r := l.r
	for {
		closed, err := l.poll()
		if err != nil {
			return err
		}
		if closed {
			return nil
		}
		if r.vs != nil && l.ctx.Err() == nil {
			l.expireParked()
		}
		at := l.g.endAt(r.o.CommitInterval)
		stopping := l.ctx.Err() != nil
		if !stopping && (at.IsZero() || time.Now().Before(at)) {
			continue
		}
		if err := l.endTxn(stopping); err != nil {
			return err
		}
		if stopping {
			return nil
		}
	}
}

// poll polls once, sleeping no longer than until the open transaction
// ends, a held partition is due or a parked record times out, and
// delivers what it fetched. The wake-up is registered first, so that a
// worker joining the transaction, or partitions assigned, after the
// deadline is computed still end the poll. closed reports that the client
// was closed.
func (l *runLoop) poll() (closed bool, err error) {
	r := l.r
	base, cancel := context.WithCancel(l.ctx)
	defer cancel()
	l.g.setKick(cancel)
	defer l.g.setKick(nil)
	if r.vs != nil {
		r.vs.setKick(cancel)
		defer r.vs.setKick(nil)
	}
	now := time.Now()
	wake := l.holds.resume(l.cl, now)
	soon := func(at time.Time) {
		if !at.IsZero() && (wake.IsZero() || at.Before(wake)) {
			wake = at
		}
	}
	soon(l.g.endAt(r.o.CommitInterval))
	if r.vs != nil {
		soon(r.vs.nextExpiry())
	}
	if l.ctx.Err() != nil || (!wake.IsZero() && !wake.After(now)) {
		return false, nil
	}
	pctx, stop := base, context.CancelFunc(func() {})
	if !wake.IsZero() {
		pctx, stop = context.WithDeadline(base, wake)
	}
	defer stop()
	room := r.o.MaxRecords - int(l.backlogs.Load())
	if room <= 0 {
		<-pctx.Done() // the backlogs are full: wait for the transaction to end
		return false, nil
	}
	fetches := l.sess.PollRecords(pctx, room)
	if fetches.IsClientClosed() {
		return true, nil
	}
	r.logFetchErrors(fetches)
	l.lag.fetched(l.obs, fetches)
	if r.vs != nil && l.ctx.Err() == nil {
		// A partition assigned again may have changelog writes in the
		// open transaction (which then aborts): end it before restoring,
		// which waits until no transaction is open on the changelog.
		if len(r.vs.missing(r.cfg.Topics)) > 0 && !l.g.endAt(r.o.CommitInterval).IsZero() {
			if err := l.endTxn(false); err != nil {
				return false, err
			}
		}
		if err := r.restore(l.ctx); err != nil {
			return true, nil // ctx is done
		}
	}
	l.deliver(fetches)
	return false, nil
}

// deliver hands the fetched records to their partitions, holding back the
// retry-topic records that are not due.
func (l *runLoop) deliver(fetches kgo.Fetches) {
	r := l.r
	now := time.Now()
	fetches.EachRecord(func(rec *kgo.Record) {
		if l.holds.keep(l.cl, rec, now) {
			r.statsMu.Lock()
			r.c.held.Add(1)
			r.statsMu.Unlock()
			return
		}
		if st := l.owned.get(tp{rec.Topic, rec.Partition}); st != nil {
			st.deliver(rec)
		}
	})
	l.holds.rewind(l.cl)
}

// expireParked sends the parked records that waited past GapTimeout to
// their key-shards, which dead-letter them.
func (l *runLoop) expireParked() {
	r := l.r
	for _, p := range r.vs.takeExpired(time.Now()) {
		st := l.owned.get(tp{p.Topic, p.Partition})
		if st == nil {
			continue
		}
		shard := partition.Shard(p.Topic, p.Partition, p.Offset, p.Key, r.cfg.Shards, r.cfg.NullKeys)
		st.mu.Lock()
		epoch := st.epoch
		st.mu.Unlock()
		l.pool.Dispatch(shard, st.a, item{part: st, epoch: epoch, expire: p})
	}
}

// endTxn ends the open transaction: it commits what the workers added to
// it with the partitions' offsets, or aborts it and rewinds the
// partitions, and, unless the runner stops, begins the next one.
func (l *runLoop) endTxn(stopping bool) error {
	r := l.r
	tx := l.g.shut()
	if stopping {
		l.g.close()
	}
	tx.wg.Wait()
	if tx.first.IsZero() && !stopping {
		l.g.open(tx) // nothing joined: the transaction stays open
		return nil
	}
	open := func() time.Duration {
		if tx.first.IsZero() {
			return 0
		}
		return time.Since(tx.first)
	}
	committed, err := l.commitOrAbort(tx, open)
	if err != nil {
		return err
	}
	l.ended(tx, committed)
	if stopping {
		return nil
	}
	if err := l.sess.Begin(); err != nil {
		if terr := r.timedOut(open(), err); terr != nil {
			return terr
		}
		return fmt.Errorf("kscope: beginning a transaction: %w", err)
	}
	l.g.open(&txnState{})
	return nil
}

// commitOrAbort ends tx on the broker: it commits, with the partitions'
// offsets, unless a produce in it failed; a fenced producer or a timed-out
// transaction is fatal.
func (l *runLoop) commitOrAbort(tx *txnState, open func() time.Duration) (committed bool, err error) {
	r, ctx := l.r, l.ctx
	try := kgo.TryCommit
	if err := tx.failed(); errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		l.sess.End(context.WithoutCancel(ctx), kgo.TryAbort) //nolint:errcheck // fenced: nothing of ours can commit
		return false, r.fenced(err, open())
	}
	if err := tx.failed(); err != nil {
		try = kgo.TryAbort
		r.log.Warn("kscope: aborting the transaction; its records are consumed again", "err", err)
	}
	endCtx, installed := l.owned.commitOffsets(context.WithoutCancel(ctx))
	endCtx, cancel := context.WithTimeout(endCtx, r.o.TransactionTimeout)
	defer cancel()
	committed, err = l.sess.End(endCtx, try)
	if err != nil && r.recovered(endCtx, l.sess, err) {
		committed, err = false, nil
	}
	if err != nil {
		if terr := r.timedOut(open(), err); terr != nil {
			return false, terr
		}
		if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
			return false, r.fenced(err, open())
		}
		return false, fmt.Errorf("kscope: ending the transaction (transactional id %s): %w", r.o.TransactionalID, err)
	}
	if committed {
		installed()
	} else {
		l.owned.rewind(l.cl)
	}
	return committed, nil
}

// ended accounts for tx once it committed or aborted: the version store,
// the records' outcomes, lag, and the counters.
func (l *runLoop) ended(tx *txnState, committed bool) {
	r := l.r
	if r.vs != nil {
		r.vs.end(committed)
	}
	tx.finish(l.obs, committed)
	if committed {
		l.obs.Commit(l.lag.partitions(), nil)
		l.lag.report(l.obs, l.cl)
	} else {
		l.obs.Commit(l.lag.partitions(), errAborted)
	}
	l.lag.reset()
	r.statsMu.Lock()
	if committed {
		r.committed.Add(1)
		r.c.add(&tx.counters)
	} else {
		r.aborts.Add(1)
	}
	r.statsMu.Unlock()
}
