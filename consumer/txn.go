package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/partition"
)

// txnPart is what the last committed transaction recorded for one
// partition ([commit.Done]); it outlives the partition's assignments when
// an aborted transaction rewinds them. known is false until an offset was
// fetched for the partition or a record delivered.
type txnPart struct {
	mu    sync.Mutex
	known bool
	done  commit.Done
}

func (t *txnPart) get() (commit.Done, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.done, t.known
}

func (t *txnPart) set(d commit.Done) {
	t.mu.Lock()
	t.known, t.done = true, d
	t.mu.Unlock()
}

// setFirst makes offset the committed state of a partition that had none
// (nothing committed: its first record is where an abort rewinds to).
func (t *txnPart) setFirst(offset int64) {
	t.mu.Lock()
	if !t.known {
		t.known, t.done = true, commit.Done{Offset: offset, End: offset}
	}
	t.mu.Unlock()
}

// txnCtl is what a transactor is handed (UseTxn): the runner's
// transactional session and the gate of its open transaction.
type txnCtl struct{ r *Runner }

// Session returns the runner's transactional session.
func (t txnCtl) Session() *kgo.GroupTransactSession { return t.r.sess }

// Join waits for an open transaction and reports whether rec's effects may
// join it; see gate.join.
func (t txnCtl) Join(rec *Record) bool { return t.r.gate.join(rec) }

// Leave ends a Join.
func (t txnCtl) Leave(input bool) { t.r.gate.leave(input) }

// Kick wakes the poll loop, so that it asks TxnTick again.
func (t txnCtl) Kick() {
	g := t.r.gate
	g.mu.Lock()
	g.wake()
	g.mu.Unlock()
}

// End ends the open transaction now (from TxnPrepare only).
func (t txnCtl) End() error { return t.r.endTxn(t.r.runCtx, false) }

// Schedule runs fn on the key-shard worker of key in partition p of topic,
// in order with that shard's records, under the partition's current
// assignment; it reports false when the partition is not assigned.
func (t txnCtl) Schedule(topic string, p int32, key []byte, fn func(ctx context.Context, rec *Record)) bool {
	r := t.r
	st := r.state(topic, p)
	if st == nil || st.Revoked() {
		return false
	}
	shard := partition.Shard(topic, p, -1, key, r.cfg.Shards, r.cfg.NullKeys)
	rec := &Record{Record: &kgo.Record{Topic: topic, Partition: p, Key: key, Offset: -1}, part: st, shard: int32(shard), state: recDone, task: fn}
	r.pool.Dispatch(shard, st.Assignment, rec)
	return true
}

// txnLoop polls and ends transactions until the runner stops; a fatal
// error (a fenced producer, a timed-out transaction, a write the broker
// refuses) ends it.
func (r *Runner) txnLoop(ctx context.Context) error {
	r.shardBuf = make([][]*Record, r.cfg.Shards)
	if err := r.sess.Begin(); err != nil {
		return fmt.Errorf("kscope: beginning a transaction: %w", err)
	}
	r.gate.open()
	for {
		if r.pollOnce(ctx) {
			return nil // the client closed
		}
		if err := r.fatalErr(); err != nil {
			r.abortOpen(ctx)
			return err
		}
		at := r.gate.endAt(r.txnInterval)
		stopping := ctx.Err() != nil
		if !stopping && (at.IsZero() || time.Now().Before(at)) {
			continue
		}
		if err := r.endTxn(ctx, stopping); err != nil {
			return err
		}
		if stopping {
			return nil
		}
	}
}

// txnPollContext returns the context a transactional runner polls under:
// it ends when the open transaction ends, when the scope has work due
// (TxnTick), or at a kick (the first join of a transaction, or the
// scope's Kick), or nil when one of them is due already. The kick is
// registered before the deadline is computed, so that a worker joining
// meanwhile still ends the poll. stop releases the context.
func (r *Runner) txnPollContext(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	r.gate.setKick(cancel)
	stop := func() {
		r.gate.setKick(nil)
		cancel()
	}
	now := time.Now()
	wake := r.txs.TxnTick(now)
	if at := r.gate.endAt(r.txnInterval); !at.IsZero() && (wake.IsZero() || at.Before(wake)) {
		wake = at
	}
	if ctx.Err() != nil || (!wake.IsZero() && !wake.After(now)) {
		stop()
		return nil, nil
	}
	if !wake.IsZero() {
		var stopDeadline context.CancelFunc
		ctx, stopDeadline = context.WithDeadline(ctx, wake)
		return ctx, func() {
			stopDeadline()
			stop()
		}
	}
	return ctx, stop
}

// endTxn ends the open transaction: it commits what the workers added to
// it with the partitions' offsets, or aborts it and rewinds the
// partitions, and, unless the runner stops, begins the next one.
func (r *Runner) endTxn(ctx context.Context, stopping bool) error {
	j := r.gate.shut()
	first := j.first
	if stopping {
		r.gate.close()
	}
	if first.IsZero() && !stopping {
		r.gate.reopen() // nothing joined: the transaction stays open
		return nil
	}
	open := func() time.Duration {
		if first.IsZero() {
			return 0
		}
		return time.Since(first)
	}
	committed, reloaded, err := r.commitOrAbort(ctx, open, j)
	if err != nil {
		// The runner stops (fenced, refused, not ended) or starts a new
		// session (errRenewSession): nothing of the transaction is
		// known to this process to have committed, and the scope ends
		// its deliveries as aborted.
		r.txs.TxnEnded(false)
		return err
	}
	r.txs.TxnEnded(committed)
	if stopping {
		return nil
	}
	if err := r.sess.Begin(); err != nil {
		if reloaded && (errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)) {
			// The fence answered the reload that aborted the
			// transaction whose end failed; how long that
			// transaction was open includes reading its outcome
			// back, so it says nothing of a timeout.
			return fmt.Errorf("%w: the producer was fenced when it was reloaded after ending a transaction failed (transactional id %s): %w", errRenewSession, r.txnID, err)
		}
		if terr := r.txnTimedOut(open(), err); terr != nil {
			return terr
		}
		return fmt.Errorf("kscope: beginning a transaction: %w", err)
	}
	r.gate.open()
	return nil
}

// abortOpen aborts the open transaction of a runner that stops on an
// error outside the transaction's end: left open, it would hold every
// read_committed consumer of its outputs back until the broker timed it
// out. Nothing of it commits; the partitions' next owner consumes its
// records again.
func (r *Runner) abortOpen(ctx context.Context) {
	r.gate.shut()
	r.gate.close()
	if err := r.txs.TxnFlush(); err != nil {
		r.log.Debug("kscope: a produce of the transaction aborted at the stop failed", "err", err)
	}
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.txnTimeout)
	defer cancel()
	if _, err := r.sess.End(endCtx, kgo.TryAbort); err != nil {
		r.log.Warn("kscope: aborting the open transaction at the stop failed; the broker aborts it after the transaction timeout", "err", err, "transaction_timeout", r.txnTimeout)
	}
	r.txs.TxnEnded(false)
}

// txnOffsets returns the context that ends a transaction: it commits, for
// every assigned partition whose state moved, the offset at its lowest
// unfinished record with, in the metadata, the finished records above it;
// and those states, to install once the transaction committed.
func (r *Runner) txnOffsets(ctx context.Context) (context.Context, map[tp]txnPoint) {
	r.mu.Lock()
	sts := make([]*partState, 0, len(r.parts))
	for _, st := range r.parts {
		sts = append(sts, st)
	}
	r.mu.Unlock()
	points := map[tp]txnPoint{}
	for _, st := range sts {
		prior, known := st.txc.get()
		if !known || st.Revoked() {
			continue
		}
		if d := st.Watermark.Progress(prior); !d.Equal(prior) {
			points[tp{st.Topic, st.Partition}] = txnPoint{st.txc, d}
		}
	}
	return kgo.PreTxnCommitFnContext(ctx, func(req *kmsg.TxnOffsetCommitRequest) error {
		setTxnOffsets(req, points)
		return nil
	}), points
}

// setTxnOffsets makes req commit exactly points: the session's own offsets
// (the head of what was polled, which may lie past unfinished records) are
// replaced.
func setTxnOffsets(req *kmsg.TxnOffsetCommitRequest, points map[tp]txnPoint) {
	seen := map[tp]bool{}
	topics := req.Topics[:0]
	for _, t := range req.Topics {
		parts := t.Partitions[:0]
		for _, rp := range t.Partitions {
			k := tp{t.Topic, rp.Partition}
			pt, ok := points[k]
			if !ok {
				continue
			}
			seen[k] = true
			rp.Offset, rp.LeaderEpoch, rp.Metadata = pt.done.Offset, -1, kmsg.StringPtr(pt.done.Metadata())
			parts = append(parts, rp)
		}
		if len(parts) > 0 {
			t.Partitions = parts
			topics = append(topics, t)
		}
	}
	req.Topics = topics
	for k, pt := range points {
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
		rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = k.partition, pt.done.Offset, -1, kmsg.StringPtr(pt.done.Metadata())
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
	}
}

// rewindAll rewinds every assigned partition to its committed state after
// an aborted transaction: each gets a new assignment (the work of the old
// one is dropped, as after a revoke), and the consumer fetches again from
// the committed offset; the records done there are skipped again.
func (r *Runner) rewindAll() {
	r.rewinds++
	type swap struct{ old, cur *partState }
	var swaps []swap
	r.mu.Lock()
	for k, st := range r.parts {
		st.Revoke()
		cur := &partState{Assignment: partition.NewAssignment(r.hardCtx, r.tracker.Assign(k.topic, k.partition)), txc: st.txc, bufs: r.doneBufs}
		r.parts[k] = cur
		swaps = append(swaps, swap{st, cur})
	}
	r.mu.Unlock()
	set := map[string]map[int32]kgo.EpochOffset{}
	for _, s := range swaps {
		r.pool.Purge(s.old.Assignment)
		r.dropHeld(s.old)
		s.old.Cancel()
		r.resume(s.old)
		r.setHoldPaused(s.old, false)
		if d, ok := s.old.txc.get(); ok {
			if set[s.old.Topic] == nil {
				set[s.old.Topic] = map[int32]kgo.EpochOffset{}
			}
			set[s.old.Topic][s.old.Partition] = kgo.EpochOffset{Epoch: -1, Offset: d.Offset}
		}
	}
	r.gate.release()
	if len(set) > 0 {
		r.cl.SetOffsets(set)
	}
}

// onOffsetsFetched installs, for the partitions just assigned, the state
// their last transaction committed: the offset and, in its metadata, the
// records done above it.
func (r *Runner) onOffsetsFetched(_ context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
	ps := map[string][]int32{}
	for _, g := range resp.Groups {
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 {
					continue
				}
				st := r.state(t.Topic, p.Partition)
				if st == nil {
					continue
				}
				ps[t.Topic] = append(ps[t.Topic], p.Partition)
				if p.Offset < 0 {
					continue // nothing committed: known at the first record
				}
				meta := ""
				if p.Metadata != nil {
					meta = *p.Metadata
				}
				d, err := commit.ParseDone(p.Offset, meta)
				if err != nil {
					r.log.Warn("kscope: the committed offset's metadata is not what kscope wrote for it; records above the offset are handled again",
						"topic", t.Topic, "partition", p.Partition, "offset", p.Offset, "err", err)
				}
				st.txc.set(d)
			}
		}
	}
	if len(ps) > 0 {
		r.txs.TxnAssigned(ps)
	}
	return nil
}

// txnSkip marks done, among the records a poll added to st's watermark,
// those that the partition's committed state says are done (their outputs
// committed before a crash, a rebalance or an abort), and returns the
// others, and the bytes of those it marked.
func (r *Runner) txnSkip(st *partState, recs []*kgo.Record) (keep []*kgo.Record, skippedBytes int64) {
	st.txc.setFirst(recs[0].Offset)
	prior, _ := st.txc.get()
	if recs[0].Offset >= prior.End {
		return recs, 0 // the common case: past everything the state knows
	}
	var done []int64
	keep = recs[:0:0]
	for _, rec := range recs {
		if prior.IsDone(rec.Offset) {
			done = append(done, rec.Offset)
			skippedBytes += recordSize(rec)
			continue
		}
		keep = append(keep, rec)
	}
	if len(done) > 0 {
		st.Watermark.DoneAll(done)
	}
	return keep, skippedBytes
}
