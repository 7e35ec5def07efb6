package consumer

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/kscope-dev/kscope/partition"
)

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

	// What the stall watch reads (watchStalls): the batch the worker
	// runs (nil when idle), a count of the batches begun, the records
	// done since the batch began, and the handler calls (call, again).
	batch    []*Record
	batches  uint64
	finished int
	waiting  bool // the scope waits between two rounds of retries (Rounds): not a stall
	// call marks the handler calls of the worker's batch: the offset + 1
	// of the record whose handler runs now, minus that of the one whose
	// handler returned last, 0 before the batch's first. Its records are
	// of one partition, so the offset names the record; a new value is a
	// call begun or ended. again counts the calls of the record called
	// just before (a retry in place), which leave call as it was. Both
	// are atomic, outside mu: they change at every handler call, and a
	// lock taken twice a record costs a fifth of the runner's CPU per
	// record with a fast handler. call is an integer, not the record's
	// pointer, whose every store would also pay the garbage collector's
	// write barrier.
	call  atomic.Int64
	again atomic.Uint64
}

// begin marks batch as the worker's, for the stall watch.
func (d *doneBuf) begin(batch []*Record) {
	d.mu.Lock()
	d.batch = batch
	d.batches++
	d.finished = 0
	d.mu.Unlock()
}

// end hands over the batch's done reports and marks the worker idle.
func (d *doneBuf) end() {
	d.mu.Lock()
	d.flushLocked()
	d.batch, d.waiting = nil, false
	d.call.Store(0)
	d.mu.Unlock()
}

// wait marks the worker as waiting between two rounds of retries (on),
// or done waiting, for the stall watch.
func (d *doneBuf) wait(on bool) {
	d.mu.Lock()
	d.waiting = on
	d.mu.Unlock()
}

// handlerCall marks rec's handler as running or returned, for the stall
// watch.
func (d *doneBuf) handlerCall(rec *Record, running bool) {
	mark := rec.offset + 1
	if !running {
		d.call.Store(-mark)
		return
	}
	if prev := d.call.Load(); prev == mark || prev == -mark {
		d.again.Add(1)
	}
	d.call.Store(mark)
}

// callingLocked returns the record of the worker's batch whose handler
// runs now, or nil. d.mu is held.
func (d *doneBuf) callingLocked() *Record {
	mark := d.call.Load()
	if mark <= 0 {
		return nil
	}
	for _, rec := range d.batch {
		if rec.offset == mark-1 {
			return rec
		}
	}
	return nil
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
	d.r.shareAck(rec, true)
	d.finished++
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
		d.offsets = append(d.offsets, rec.offset)
	}
	n := st.Watermark.DoneAll(d.offsets)
	if n > 0 {
		d.r.done.Add(int64(n))
	}
	clear(d.recs)
	d.recs, d.offsets = d.recs[:0], d.offsets[:0]
	if st.paused.Load() && int64(st.Watermark.Pending()) <= st.resumeAt.Load() {
		d.r.resume(st)
	}
	if d.r.txs != nil && n > 0 {
		st.active.Add(-int64(n))
		d.r.releaseSlots(st)
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
// gives the batch's in-flight room back at once. A task a transactional
// scope scheduled (scope.TxnEngine.Schedule) runs in its place in the batch.
func (r *Runner) process(ctx context.Context, a *partition.Assignment, batch []*Record) {
	for len(batch) > 0 {
		if t := batch[0].task; t != nil {
			t(ctx, batch[0])
			batch = batch[1:]
			continue
		}
		n := 1
		for n < len(batch) && batch[n].task == nil {
			n++
		}
		r.processRecords(ctx, batch[:n])
		batch = batch[n:]
	}
}

func (r *Runner) processRecords(ctx context.Context, batch []*Record) {
	d := r.doneBufs[batch[0].shard]
	d.begin(batch)
	r.unit.Process(ctx, batch, d.fn)
	d.end()
	if kb := r.keys(); kb != nil {
		// A record its key's breaker holds keeps its room; the lock
		// orders this with the drop of a revoked partition's holds.
		kb.mu.Lock()
		defer kb.mu.Unlock()
	}
	var n, bytes int64
	stopping := r.runCtx != nil && r.runCtx.Err() != nil
	for _, rec := range batch {
		if rec.state == recKeyHeld {
			continue
		}
		n++
		bytes += rec.size
		if rec.state == recPending && ctx.Err() == nil && !rec.Revoked() && !stopping {
			// Left undone while the partition is still ours.
			r.setFatal(fmt.Errorf("kscope: scope %T returned without finishing %s[%d]@%d while the partition is still assigned", r.unit, rec.Topic, rec.Partition, rec.Offset))
		}
		if rec.state == recPending {
			r.shareAck(rec, false)
		}
		rec.state = recDone
	}
	r.releaseN(n, bytes)
}

// drop is the pool's DropFunc for records that will never run here.
func (r *Runner) drop(_ *partition.Assignment, rec *Record) {
	if rec.state == recPending {
		r.shareAck(rec, false)
		r.release(rec)
	}
}

func (r *Runner) release(rec *Record) {
	rec.state = recDone
	r.releaseN(1, rec.size)
}

// releaseN gives back the in-flight room of n records of the given bytes,
// and wakes the poll loop if it waits for room and now has what it waits
// for (see waitForRoom): one wake-up per wait, not one per finished batch.
func (r *Runner) releaseN(n, bytes int64) {
	r.inflight.Add(-n)
	r.inflightBytes.Add(-bytes)
	if r.waiting.Load() && r.roomToPoll() {
		select {
		case r.room <- struct{}{}:
		default:
		}
	}
}

// roomToPoll reports whether half the capacity is free: the room the poll
// loop waits for before it polls.
func (r *Runner) roomToPoll() bool {
	room, capacity := r.roomNow()
	return room >= max(capacity/2, 1)
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

// pauseBusiest pauses fetching for the partitions that hold more than one
// and a half times their fair share of the capacity (a slow partition
// hogging the bound), so that the room that frees up goes to the others,
// the partitions with records in flight or waiting that hold less. It pauses nothing when the load is
// about even, or when no other partition would be left fetching: a pause
// drops what the client buffered for the partition, to be fetched again on
// resume. A partition that a user's pause (or a breaker's) or a delay hold
// keeps from fetching is not left fetching, and competes only with the
// records it has in flight. A paused partition resumes when its unfinished
// records fall to half its share.
func (r *Runner) pauseBusiest(capacity int64) {
	type cand struct {
		st      *partState
		pending int
		held    bool // another reason keeps it from fetching
	}
	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	// The partitions that compete for room are those with records in
	// flight or, when they fetch, records waiting to be polled; an idle
	// one (an empty retry topic's, say) takes none, and neither does one
	// with records waiting that a pause holds.
	r.mu.Lock()
	cs := make([]cand, 0, len(r.parts))
	all := make([]*partState, 0, len(r.parts))
	for _, st := range r.parts {
		all = append(all, st)
		held := st.holdPaused || r.userHolds(st)
		if n := st.Watermark.Pending(); n > 0 || (!held && st.hwm.Load() > st.polledTo.Load()) {
			cs = append(cs, cand{st, n, held})
		}
	}
	r.mu.Unlock()
	sort.Slice(cs, func(i, j int) bool { return cs[i].pending > cs[j].pending })
	pending, paused := make([]int, len(cs)), make([]bool, len(cs))
	for i, c := range cs {
		pending[i], paused[i] = c.pending, c.held || c.st.paused.Load()
	}
	busy, share := hogs(pending, paused, capacity)

	toPause := make(map[string][]int32)
	for _, c := range cs[:busy] {
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
	for _, st := range all {
		if st.paused.Load() && int64(st.Watermark.Pending()) <= st.resumeAt.Load() {
			r.resumeLocked(st)
		}
	}
}

// resume resumes fetching a partition paused for backpressure, unless a
// delay hold or a user's pause (pause.go) still holds it: a partition is
// fetched only when no reason holds it. Pausing and resuming are
// serialized, so the client's paused set and the runner's flags cannot
// disagree.
func (r *Runner) resume(st *partState) {
	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	r.resumeLocked(st)
}

func (r *Runner) resumeLocked(st *partState) {
	if st.paused.Load() {
		st.paused.Store(false)
		r.paused.Add(-1)
		if !st.holdPaused && !r.userHolds(st) {
			r.cl.ResumeFetchPartitions(map[string][]int32{st.Topic: {st.Partition}})
		}
	}
}

// setHoldPaused pauses fetching of a delay-topic partition while its head
// record waits for its due time, and resumes it after, unless backpressure
// or a user's pause still holds it. A revoked partition is never paused: forget, which
// resumes it, may have run already, and the client keeps a pause across
// rebalances (the partition, assigned here again, would never be fetched).
func (r *Runner) setHoldPaused(st *partState, on bool) {
	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	if st.holdPaused == on || (on && st.Revoked()) {
		return
	}
	st.holdPaused = on
	tps := map[string][]int32{st.Topic: {st.Partition}}
	switch {
	case on:
		r.cl.PauseFetchPartitions(tps)
	case !st.paused.Load() && !r.userHolds(st):
		r.cl.ResumeFetchPartitions(tps)
	}
}

// hogs decides a backpressure pause: given the pending records of the
// partitions that compete for room, busiest first, and which of them are
// not fetching (paused for backpressure, by a user's pause or by a delay
// hold), it returns how many of the busiest hold more than one and a half
// times their share of capacity (to pause them), and the share. It returns none when
// pausing them would leave no other competing partition fetching.
func hogs(pending []int, paused []bool, capacity int64) (busy int, share int64) {
	share = max(capacity/int64(max(len(pending), 1)), 1)
	for _, n := range pending {
		if int64(n) <= share*3/2 {
			break
		}
		busy++
	}
	for i := busy; i < len(pending); i++ {
		if !paused[i] {
			return busy, share
		}
	}
	// Pausing would leave no competing partition fetching: the room that
	// frees up would go to none of them, and the client would drop what
	// it buffered for them, to be fetched again once they resume, with
	// nothing in flight meanwhile. The bound holds anyway: the poll loop
	// takes nothing until there is room.
	return 0, share
}
