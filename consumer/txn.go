package consumer

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/partition"
	"github.com/kscope-dev/kscope/scope"
)

// renewAfter is the least time between two sessions renewed: a producer
// fenced again so soon is taken for a real fence (another producer with
// the same transactional id), which stops the runner.
const renewAfter = time.Minute

// txnLoop polls until the runner stops, and has the transactional scope
// end its transactions after every poll; a fatal error (a fenced producer,
// a timed-out transaction, a write the broker refuses) ends it.
func (r *Runner) txnLoop(ctx context.Context) error {
	r.shardBuf = make([][]*Record, r.cfg.Shards)
	for {
		if r.pollOnce(ctx) {
			return nil // the client closed
		}
		if err := r.fatalErr(); err != nil {
			r.txs.TxnAbort(ctx)
			return err
		}
		stopping := ctx.Err() != nil
		if err := r.txs.TxnPolled(ctx, stopping); err != nil {
			return err
		}
		if stopping {
			return nil
		}
	}
}

// txnEngine is the scope.TxnEngine a runner hands its transactional scope.
type txnEngine struct{ r *Runner }

var _ scope.TxnEngine[*Record] = txnEngine{}

// Session returns the runner's transactional session.
func (t txnEngine) Session() *kgo.GroupTransactSession { return t.r.sess }

// Group returns the runner's consumer group.
func (t txnEngine) Group() string { return t.r.cfg.Group }

// FlushDone hands the workers' kept done reports to the watermarks.
func (t txnEngine) FlushDone() { t.r.flushDone() }

// Progress returns what every assigned partition whose state prior knows
// commits now, when its watermark moved past prior.
func (t txnEngine) Progress(prior func(topic string, partition int32) (commit.Done, bool)) []scope.PartitionDone {
	r := t.r
	r.mu.Lock()
	sts := make([]*partState, 0, len(r.parts))
	for _, st := range r.parts {
		sts = append(sts, st)
	}
	r.mu.Unlock()
	var out []scope.PartitionDone
	for _, st := range sts {
		p, known := prior(st.Topic, st.Partition)
		if !known || st.Revoked() {
			continue
		}
		if d := st.Watermark.Progress(p); !d.Equal(p) {
			out = append(out, scope.PartitionDone{Topic: st.Topic, Partition: st.Partition, Done: d})
		}
	}
	return out
}

// Committed counts and reports a committed transaction.
func (t txnEngine) Committed(partitions int, topics ...string) {
	r := t.r
	r.commits.Add(1)
	r.obs.Commit(partitions, nil, topics...)
	if r.obs.WantsLag() {
		r.reportLag()
	}
}

// Aborted counts a transaction that did not commit, and reports it to the
// hooks when report is not nil.
func (t txnEngine) Aborted(partitions int, report error, topics ...string) {
	t.r.commitErrs.Add(1)
	if report != nil {
		t.r.obs.Commit(partitions, report, topics...)
	}
}

// Rewind rewinds every assigned partition: each gets a new assignment (the
// work of the old one is dropped, as after a revoke), and the consumer
// fetches again from the offset committed gives for it.
func (t txnEngine) Rewind(committed func(topic string, partition int32) (int64, bool)) {
	r := t.r
	r.rewinds++
	type swap struct{ old, cur *partState }
	var swaps []swap
	r.mu.Lock()
	for k, st := range r.parts {
		st.Revoke()
		cur := &partState{Assignment: partition.NewAssignment(r.assignCtx(), r.tracker.Assign(k.topic, k.partition)), bufs: r.doneBufs}
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
		if off, ok := committed(s.old.Topic, s.old.Partition); ok {
			if set[s.old.Topic] == nil {
				set[s.old.Topic] = map[int32]kgo.EpochOffset{}
			}
			set[s.old.Topic][s.old.Partition] = kgo.EpochOffset{Epoch: -1, Offset: off}
		}
	}
	if len(set) > 0 {
		r.cl.SetOffsets(set)
	}
}

// Schedule runs fn on the key-shard worker of key in partition p of topic,
// in order with that shard's records, under the partition's current
// assignment; it reports false when the partition is not assigned.
func (t txnEngine) Schedule(topic string, p int32, key []byte, fn func(ctx context.Context, rec *Record)) bool {
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
