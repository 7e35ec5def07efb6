package consumer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/partition"
)

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
	var topics []string
	if r.obs.wantsCommit() {
		topics = commitTopics(res.Offsets)
	}
	r.obs.Commit(n, res.Err, topics...)
	if res.Err != nil {
		r.commitErrs.Add(1)
		return
	}
	r.commits.Add(1)
}

func (r *Runner) onAssigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	r.rebalances.Add(1)
	r.endUnreported(assigned)
	if r.txs != nil {
		// Before the offsets are fetched: the scope's committed state of
		// these partitions is unknown until then.
		r.txs.TxnAssigning(assigned)
	}
	// Joined only once the scope knows the partitions: Health reads
	// joined before the scope's Stats.Waiting, which then names what the
	// scope still restores of them.
	if !r.joined.Swap(true) {
		r.logJoin()
	}
	r.mu.Lock()
	for topic, ps := range assigned {
		for _, p := range ps {
			k := tp{topic, p}
			wm := r.tracker.Assign(topic, p)
			r.parts[k] = &partState{Assignment: partition.NewAssignment(r.assignCtx(), wm), bufs: r.doneBufs}
		}
	}
	r.mu.Unlock()
	r.pauseAssigned(cl, assigned)
	r.obs.Rebalance("assigned", count(assigned))
	r.log.Info("kscope: partitions assigned", "partitions", assigned)
}

// endUnreported ends, as lost, the earlier assignments of partitions assigned
// to this member again without a revoke in between. franz-go's
// transactional session passes on one revoke (or loss) per transaction, so
// a second partition revoked before the transaction ends is not reported.
// Its records are dropped, its pauses lifted (the client keeps a pause
// across rebalances), and the scope is told it is gone, so that nothing
// of the earlier assignment commits; the new one reads from the committed
// offset.
func (r *Runner) endUnreported(assigned map[string][]int32) {
	stale := make(map[string][]int32)
	r.mu.Lock()
	for topic, ps := range assigned {
		for _, p := range ps {
			if r.parts[tp{topic, p}] != nil {
				stale[topic] = append(stale[topic], p)
			}
		}
	}
	r.mu.Unlock()
	if len(stale) == 0 {
		return
	}
	r.log.Warn("kscope: partitions assigned again whose revoke was not reported; ending their earlier assignment as lost", "partitions", stale)
	r.abandon(stale)
}

// abandon ends the given assignments without committing anything for
// them: their records stop, and a transactional runner's open transaction
// aborts.
func (r *Runner) abandon(parts map[string][]int32) []*partState {
	sts := r.detach(parts)
	if r.txs != nil {
		r.txnGone(sts, parts)
		return sts
	}
	for _, st := range sts {
		st.Cancel()
	}
	r.forget(sts)
	return sts
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
	if r.txs != nil {
		r.txnGone(sts, revoked)
		return
	}
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

// txnGone ends revoked or lost partitions of a transactional runner: the
// transactional session aborts the open transaction (the partitions' next
// owner redoes its work), so nothing is drained or committed; the records
// of the partitions still running stop.
func (r *Runner) txnGone(sts []*partState, ps map[string][]int32) {
	for _, st := range sts {
		st.Cancel()
	}
	r.forget(sts)
	// With an assignment ended, the session aborts the open transaction
	// and reports no other revoke or loss until a transaction ends: the
	// scope ends it soon, even if nothing joined it, so that the next one
	// reaches onRevoked (or onLost).
	r.txs.TxnGone(ps, len(sts) > 0)
}

// onLost commits nothing: another member may own the partitions already.
func (r *Runner) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	r.rebalances.Add(1)
	r.joined.Store(false)
	r.obs.Rebalance("lost", count(lost))
	sts := r.abandon(lost)
	r.lost.Add(int64(len(sts)))
	if r.txs == nil && len(sts) > 0 {
		r.log.Warn("kscope: partitions lost; nothing committed for them", "partitions", lost)
	}
}

// drainLogEvery is how often a drain that takes a while says how many
// records it still waits for.
const drainLogEvery = 2 * time.Second

// drain waits, up to DrainTimeout in all, for the running records of sts,
// then cancels the context of those still running. A drain that takes
// longer than drainLogEvery logs how many records it still waits for, so
// that a stop (Ctrl-C) is not silent for up to DrainTimeout.
func (r *Runner) drain(sts []*partState) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.DrainTimeout)
	defer cancel()
	start := time.Now()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(drainLogEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				running := 0
				for _, st := range sts {
					running += st.Running()
				}
				if running > 0 {
					r.log.Info("kscope: draining: waiting for running records to finish before committing",
						"running", running, "waited", time.Since(start).Round(time.Millisecond), "drain_timeout", r.cfg.DrainTimeout)
				}
			}
		}
	}()
	defer func() {
		close(done)
		wg.Wait()
	}()
	for _, st := range sts {
		if err := st.WaitIdle(ctx); err != nil {
			r.log.Warn("kscope: drain timeout passed with records still running; canceling them",
				"topic", st.Topic, "partition", st.Partition, "running", st.Running(), "drain_timeout", r.cfg.DrainTimeout,
				"held_by_handlers", r.running(sts))
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
		r.unpauseGone(st)
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
	running := 0
	for _, st := range sts {
		running += st.Running()
	}
	if r.txs != nil {
		// The last transaction ended: what still runs is redone by
		// the partitions' next owner. The scope forgets the
		// partitions' state, which a new session (scope.ErrRenewSession)
		// restores when it is assigned them again.
		for _, st := range sts {
			st.Cancel()
		}
		r.txs.TxnGone(all, false)
	} else {
		r.log.Info("kscope: stopping: no new records; finishing the running ones, then committing",
			"partitions", len(sts), "running", running, "drain_timeout", r.cfg.DrainTimeout)
		r.drain(sts)
	}

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
		held := r.running(nil)
		r.hardCancel()
		err = fmt.Errorf("kscope: a handler ignored its canceled context for DrainTimeout (holding %s); Run returns with its goroutine still running", held)
	}

	if r.txs == nil {
		r.flushDone()
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.DrainTimeout)
		if cerr := r.committer.Commit(ctx, all); cerr != nil {
			r.log.Warn("kscope: final offset commit failed; the records since the last commit will be handled again", "err", cerr)
		}
		cancel()
	}
	r.forget(sts)
	cl.Close()
	r.log.Info("kscope: runner stopped")
	return err
}
