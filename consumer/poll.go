package consumer

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/prefetch"
	"github.com/kscope-dev/kscope/partition"
)

func (r *Runner) pollLoop(ctx context.Context) {
	r.shardBuf = make([][]*Record, r.cfg.Shards)
	for ctx.Err() == nil {
		if r.pollOnce(ctx) {
			return
		}
	}
}

// pollOnce waits for in-flight room, polls once and dispatches what it
// fetched. A transactional runner's poll also ends when its scope has work
// to do (scope.Transactor's TxnPollContext). It reports whether the client
// was closed.
func (r *Runner) pollOnce(ctx context.Context) (closed bool) {
	r.loopBeat.back()
	if r.txs != nil {
		// The scope prepares what was assigned since the last poll
		// (restores its state) before the poll waits, so that its timers
		// run even while no record comes.
		if err := r.txs.TxnPrepare(r.runCtx); err != nil {
			r.setFatal(err)
			return false
		}
		var stop func()
		if ctx, stop = r.txs.TxnPollContext(ctx); ctx == nil {
			return false // due now
		}
		defer stop()
	}
	if !r.roomToPoll() {
		r.waitForRoom(ctx)
		return false
	}
	room, _ := r.roomNow()
	r.loopBeat.wait()
	fetches := r.cl.PollRecords(ctx, int(room))
	r.loopBeat.back()
	if fetches.IsClientClosed() {
		return true
	}
	r.fetchErrors(fetches)
	if r.obs.WantsLag() {
		r.observeFetches(fetches)
	}
	if r.txs != nil {
		rewinds := r.rewinds
		if err := r.txs.TxnPrepare(r.runCtx); err != nil {
			r.setFatal(err)
			return false
		}
		if r.rewinds != rewinds {
			// The transaction TxnPrepare ended aborted: every partition
			// was rewound, and the consumer fetches again from the
			// committed offsets what this poll holds.
			return false
		}
	}
	var n, bytes int64
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		pn, pb := r.dispatchAll(p.Topic, p.Partition, p.HighWatermark, p.Records)
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
	if r.txs == nil {
		r.cl.AllowRebalance()
	}
	return false
}

// pauseAfter is how long the poll loop waits at the in-flight bound before
// it pauses the busiest partitions. Not polling already stops the client
// from fetching more than the one response per broker it buffers; pausing
// also makes the client drop what it buffered for the paused partitions
// (they are fetched again on resume), so it is kept for a bound that holds
// for longer than a burst.
const pauseAfter = 100 * time.Millisecond

// waitForRoom waits until half the capacity is free (workers signal as
// they finish). Polling only into that much room means a poll takes the
// response the client buffered whole: the client sends its next fetch only
// once the last response is all taken, so a poll that took part of it
// would leave the client idle while the workers run. If the bound itself
// holds for longer than pauseAfter, it pauses the busiest partitions, so
// that the room that frees up goes to the others.
func (r *Runner) waitForRoom(ctx context.Context) {
	r.waiting.Store(true)
	defer r.waiting.Store(false)
	r.loopBeat.wait()
	defer r.loopBeat.back()
	// Workers wake the wait once half the capacity is free, not at each
	// finished batch; the ticker finds a bound that holds (a held retry
	// record that falls due takes its room back while the loop waits).
	tick := time.NewTicker(pauseAfter)
	defer tick.Stop()
	room, _ := r.roomNow()
	atBound := room <= 0
	for ctx.Err() == nil && !r.roomToPoll() {
		select {
		case <-ctx.Done():
		case <-r.room:
		case <-tick.C:
			room, capacity := r.roomNow()
			if room > 0 {
				atBound = false
				continue
			}
			if atBound {
				// At the bound at two ticks: pause the hogs, once.
				r.pauseBusiest(capacity)
				tick.Stop()
			}
			atBound = true
		}
	}
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
func (r *Runner) dispatchAll(topic string, part int32, hwm int64, recs []*kgo.Record) (n, bytes int64) {
	n = int64(len(recs))
	var markers []int64
	if r.obs.WantsFetch() {
		defer func() { r.obs.Fetched(topic, part, int(n)-len(markers)) }()
	}
	st := r.state(topic, part)
	if st == nil || st.Revoked() {
		// Not ours (any more): the owner consumes them.
		return n, sizeOf(recs)
	}
	if hwm > 0 {
		st.hwm.Store(hwm)
	}
	st.polledTo.Store(recs[len(recs)-1].Offset + 1)
	first := r.addToWatermark(st, topic, recs)
	bytes = sizeOf(recs[:first])
	recs = recs[first:]
	if len(recs) > 0 && r.txs != nil {
		recs, bytes = r.skipDone(st, recs, bytes)
	}
	if len(recs) == 0 {
		return n, bytes
	}
	route, next, markers, added, markerBytes := r.routePoll(recs)
	bytes += markerBytes
	bounded := r.txs != nil
	if markers != nil {
		if !bounded {
			st.Watermark.DoneAll(markers)
		}
		if recs, route = dropMarkers(recs, route); len(recs) == 0 {
			if bounded {
				r.markersPolled(st, markers)
			}
			return n, bytes
		}
	}
	block := layOut(st, recs, route, next)
	bytes += added
	storeMax(&r.maxInflight, r.inflight.Add(int64(len(recs))))
	storeMax(&r.maxInflightBytes, r.inflightBytes.Add(added))
	r.polled.Add(int64(len(recs)))
	_, delayed := r.delays[topic]
	var now time.Time
	if delayed || bounded {
		if beforeHoldHook != nil {
			beforeHoldHook()
		}
		st.holdMu.Lock()
		defer st.holdMu.Unlock() // after the dispatch below: see hold
		if st.Revoked() {
			// Revoked since the check above (a transactional runner's
			// rebalance does not wait for the poll loop): dropHeld and
			// forget may have run already, so nothing may be held or
			// paused for it any more. Its next owner consumes the records.
			r.releaseN(int64(len(recs)), added)
			return n, bytes
		}
		now = time.Now()
	}
	r.queueByShard(st, block, route, next, delayed || bounded, bounded, now)
	if bounded && markers != nil {
		r.markersPolledLocked(st, markers)
	}
	r.dispatchQueued(st)
	return n, bytes
}

// skipDone counts done, among the records a poll added to st's watermark,
// those that the transactional scope's committed state says are done
// (their outputs committed before a crash, a rebalance or an abort), and
// returns the others, with bytes grown by the size of those it counted.
func (r *Runner) skipDone(st *partState, recs []*kgo.Record, bytes int64) ([]*kgo.Record, int64) {
	keep, done := r.txs.TxnSkip(st.Topic, st.Partition, recs)
	if len(done) == 0 {
		return keep, bytes
	}
	st.Watermark.DoneAll(done)
	return keep, bytes + sizeOf(recs) - sizeOf(keep)
}

// sizeOf returns the bytes of recs, for the in-flight bound.
func sizeOf(recs []*kgo.Record) (bytes int64) {
	for _, rec := range recs {
		bytes += recordSize(rec)
	}
	return bytes
}

// addToWatermark adds a poll's records of st to its watermark, with the
// timestamps lag is measured from when a hook wants lag, and returns how
// many of the first ones the watermark had seen before (a rewind's
// refetch).
func (r *Runner) addToWatermark(st *partState, topic string, recs []*kgo.Record) int {
	if maxDelay, delayed := r.delays[topic]; delayed && r.obs.WantsLag() {
		// A delay-topic record is behind only once it is due: its lag in
		// seconds counts from its due time, not from when it was written.
		now := time.Now()
		return st.Watermark.AddAll(len(recs), func(i int) (int64, int32, int64) {
			ts := recs[i].Timestamp
			if due, ok := dueOfKafka(recs[i], now, maxDelay); ok && due.After(ts) {
				ts = due
			}
			return recs[i].Offset, recs[i].LeaderEpoch, ts.UnixMilli()
		})
	}
	if r.obs.WantsLag() {
		return st.Watermark.AddAll(len(recs), func(i int) (int64, int32, int64) {
			return recs[i].Offset, recs[i].LeaderEpoch, recs[i].Timestamp.UnixMilli()
		})
	}
	return st.Watermark.AddAll(len(recs), func(i int) (int64, int32, int64) {
		return recs[i].Offset, recs[i].LeaderEpoch, 0
	})
}

// routePoll is the first pass over a poll's records of one partition: it
// reads each record once (its key, size and offset; the key asked for
// keyAhead records before) and notes its key-shard
// in route, counts each shard's records in next (shifted by one), and
// returns the offsets of the transaction markers among them (with their
// bytes: they carry no record to deliver, only an offset the committed
// position must pass) and the bytes of the others.
func (r *Runner) routePoll(recs []*kgo.Record) (route []routed, next []int, markers []int64, added, markerBytes int64) {
	th := partition.HashTopic(recs[0].Topic)
	route, next = r.routeBuf(len(recs))
	ahead := 0 // the keys are not read: nothing to ask for
	if r.routesByKey() {
		ahead = keyAhead
	}
	for i := range min(ahead, len(recs)) {
		prefetch.Bytes(recs[i].Key)
	}
	for i, rec := range recs {
		if ahead > 0 && i+ahead < len(recs) {
			prefetch.Bytes(recs[i+ahead].Key)
		}
		if rec.Attrs.IsControl() {
			markers = append(markers, rec.Offset)
			markerBytes += recordSize(rec)
			route[i] = routed{shard: -1}
			continue
		}
		key, nullKeys := r.routeBy(rec)
		s := int32(th.Shard(rec.Partition, rec.Offset, key, r.cfg.Shards, nullKeys))
		size := recordSize(rec)
		added += size
		route[i] = routed{offset: rec.Offset, size: size, shard: s}
		next[s+1]++
	}
	return route, next, markers, added, markerBytes
}

// keyAhead is how many records ahead of the one it routes routePoll asks
// the CPU for a key (see package prefetch): far enough for the key to
// arrive while the records between are routed. Four to 64 measured the
// same on the benchmark's records.
const keyAhead = 8

// layOut returns one block for a poll's records of st: one allocation
// instead of one per record. The block holds each key-shard's records
// together, in offset order, so that a worker walks its records in
// consecutive memory rather than one in every few hundred bytes. next
// holds each shard's count shifted by one (routePoll); layOut leaves in
// it where each shard's records end.
func layOut(st *partState, recs []*kgo.Record, route []routed, next []int) []Record {
	block := make([]Record, len(recs))
	for s := 1; s < len(next); s++ {
		next[s] += next[s-1]
	}
	for i, rt := range route {
		kr := &block[next[rt.shard]]
		next[rt.shard]++
		*kr = Record{Record: recs[i], part: st, size: rt.size, offset: rt.offset, shard: rt.shard}
	}
	return block
}

// queueByShard walks block in offset order and queues each record on its
// key-shard's dispatch buffer, unless hold keeps it (holding: a delay
// topic's record not due yet, or one past the transactional bound);
// bounded counts each queued record active. next holds where each shard's
// records end (layOut); st.holdMu is held when holding.
func (r *Runner) queueByShard(st *partState, block []Record, route []routed, next []int, holding, bounded bool, now time.Time) {
	// Shifted by one, next holds the shards' starts again.
	for i := len(next) - 1; i > 0; i-- {
		next[i] = next[i-1]
	}
	next[0] = 0
	for _, rt := range route {
		kr := &block[next[rt.shard]]
		next[rt.shard]++
		if holding && r.hold(st, kr, now) {
			continue
		}
		if bounded {
			st.active.Add(1)
		}
		r.shardBuf[kr.shard] = append(r.shardBuf[kr.shard], kr)
	}
}

// dispatchQueued hands each key-shard's queued records of st to its worker.
func (r *Runner) dispatchQueued(st *partState) {
	for shard, q := range r.shardBuf {
		if len(q) == 0 {
			continue
		}
		r.pool.DispatchAll(shard, st.Assignment, q)
		clear(q)
		r.shardBuf[shard] = q[:0]
	}
}

// beforeHoldHook, when set by a test, runs in dispatchAll just before it
// takes a partition's hold lock: where a rebalance that does not wait for
// the poll loop can revoke the partition mid-dispatch.
var beforeHoldHook func()

// routed is what dispatchAll keeps of a record between its passes; the
// shard of a transaction marker is -1.
type routed struct {
	offset, size int64
	shard        int32
}

// dropMarkers returns the records of a poll and their routes without the
// transaction markers: a new slice of records (the client's is left
// alone) and route compacted in place.
func dropMarkers(recs []*kgo.Record, route []routed) ([]*kgo.Record, []routed) {
	keep := make([]*kgo.Record, 0, len(recs))
	kept := route[:0]
	for i, rt := range route {
		if rt.shard >= 0 {
			keep = append(keep, recs[i])
			kept = append(kept, rt)
		}
	}
	return keep, kept
}

// routeBuf returns the poll loop's scratch for routing n records, and the
// shards' positions in the block (shards+1 of them, zeroed).
func (r *Runner) routeBuf(n int) (route []routed, next []int) {
	if cap(r.route) < n {
		r.route = make([]routed, n)
	}
	if len(r.routeNext) != r.cfg.Shards+1 {
		r.routeNext = make([]int, r.cfg.Shards+1)
	}
	clear(r.routeNext)
	return r.route[:n], r.routeNext
}

// observeFetches keeps each partition's high watermark for the lag hooks
// (dispatchAll reports the records fetched).
func (r *Runner) observeFetches(fs kgo.Fetches) {
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if p.HighWatermark > 0 {
			if st := r.state(p.Topic, p.Partition); st != nil {
				st.hwm.Store(p.HighWatermark)
			}
		}
	})
}

// reportLag reports every assigned partition's lag to the lag hooks. A
// partition revoked (or lost) while its lag was being reported is reported
// gone again after it: detach reports it gone once, and may do so before
// this report reached the hooks, which would then keep its series, at
// their last value, on a member that no longer owns it.
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
		paused[st] = st.paused.Load() || st.holdPaused || r.userHolds(st)
	}
	r.pauseMu.Unlock()
	for _, st := range sts {
		if st.Revoked() {
			continue
		}
		next, ts, pending, ok := st.Watermark.Position()
		hwm := st.hwm.Load()
		if !ok && hwm == 0 {
			continue // nothing fetched yet: the position is not known
		}
		l := hook.Lag{Topic: st.Topic, Partition: st.Partition, InFlight: pending, Paused: paused[st]}
		if ok {
			l.Offsets = max(hwm-next, 0)
		} else {
			l.Offsets = hwm
		}
		if ts > 0 {
			l.Age = max(now.Sub(time.UnixMilli(ts)), 0)
		}
		r.obs.Lag(l)
		if st.Revoked() {
			r.obs.Gone(st.Topic, st.Partition)
		}
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

// fetchHealthLogEvery is how often a fetch failure that lasts is logged
// again (with how long it has lasted and how many errors it saw).
const fetchHealthLogEvery = 30 * time.Second

// fetchHealth logs the state changes of fetching, not every retry: the
// first failure, a reminder every fetchHealthLogEvery while it lasts, and
// the recovery. (During a broker outage the client retries every few
// seconds; one line per retry says nothing new.)
type fetchHealth struct {
	since, lastLog time.Time // zero while fetching works
	errors         int
}

func (h *fetchHealth) failed(log *slog.Logger, topic string, p int32, err error) {
	now := time.Now()
	h.errors++
	where := []any{"topic", topic, "partition", p}
	if topic == "" {
		where = []any{"scope", "the client (no partition: the brokers or the group coordinator cannot be reached)"}
	}
	switch {
	case h.since.IsZero():
		h.since, h.lastLog = now, now
		log.Warn("kscope: fetching failed; the client retries, and kscope logs again when it works or every 30s while it does not",
			append(where, "err", err)...)
	case now.Sub(h.lastLog) >= fetchHealthLogEvery:
		h.lastLog = now
		log.Warn("kscope: fetching still fails; the client retries", append(where, "err", err, "failing_for", now.Sub(h.since).Round(time.Second), "errors", h.errors)...)
	}
}

func (h *fetchHealth) ok(log *slog.Logger) {
	if h.since.IsZero() {
		return
	}
	log.Info("kscope: fetching works again", "failed_for", time.Since(h.since).Round(time.Millisecond), "errors", h.errors)
	*h = fetchHealth{}
}
