package consumer

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/partition"
	"github.com/kscope-dev/kscope/scope"
)

// idleWork counts the calls of the runner's periodic work, for Stats.
type idleWork struct {
	runs, errors atomic.Int64
}

func (w *idleWork) stats() PeriodicStats {
	return PeriodicStats{Runs: w.runs.Load(), Errors: w.errors.Load()}
}

// idleWatch is the session's watch over its partitions' activity: it calls
// Config.Idle's functions and schedules the periodic work. Only its own
// goroutine (runIdleWork) uses its fields, but for calls, which the idle
// calls' goroutines use.
type idleWatch struct {
	r        *Runner
	ctx      context.Context
	after    time.Duration
	interval time.Duration
	run      func(ctx context.Context, topic string, partition int32) error

	parts map[tp]*idleEntry
	gen   uint64 // the current look's (stale entries are dropped)

	memberActive time.Time // when a partition of the member last had a record, or the watch began
	memberFired  bool      // Idle.Member was called for this idle period

	calls sync.WaitGroup // the idle calls running
}

// idleEntry is what the watch knows of one assigned partition.
type idleEntry struct {
	st     *partState
	gen    uint64
	polled int64     // st.polledTo at the last look
	active time.Time // when it last had a record, or was assigned
	fired  bool      // Idle.Partition was called for this idle period

	due     time.Time    // when its periodic work runs next
	running *atomic.Bool // its last periodic call scheduled, until it returns (nil: none)
}

// runIdleWork watches the session's partitions for Config.Idle and runs
// the periodic work, until ctx ends; it returns once the idle calls it
// started have returned (the periodic calls run on the key-shard workers,
// which the shutdown drains). It returns at once when neither is set.
func (r *Runner) runIdleWork(ctx context.Context) {
	interval, run := r.periodicWork()
	w := &idleWatch{r: r, ctx: ctx, after: r.cfg.Idle.After, interval: interval, run: run,
		parts: make(map[tp]*idleEntry), memberActive: time.Now()}
	if w.after <= 0 && w.run == nil {
		return
	}
	defer w.calls.Wait()
	t := time.NewTicker(w.resolution())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.look(time.Now())
		}
	}
}

// resolution is how often the watch looks: a tenth of the shortest of
// Idle.After and the periodic interval, at most a second.
func (w *idleWatch) resolution() time.Duration {
	d := time.Second
	for _, v := range []time.Duration{w.after, w.interval} {
		if v > 0 {
			d = min(d, v/10)
		}
	}
	return max(d, minIdleWork/2)
}

// look checks every assigned partition once: its activity, and whether
// its periodic work is due.
func (w *idleWatch) look(now time.Time) {
	r := w.r
	r.mu.Lock()
	sts := make([]*partState, 0, len(r.parts))
	for _, st := range r.parts {
		sts = append(sts, st)
	}
	r.mu.Unlock()
	w.gen++
	busy := false
	for _, st := range sts {
		e := w.entry(st, now)
		own := r.ownTopic(st.Topic)
		if w.after > 0 && w.watch(e, now, !own) {
			busy = true
		}
		if w.run != nil && !own {
			w.periodic(e, now)
		}
	}
	for k, e := range w.parts {
		if e.gen != w.gen {
			delete(w.parts, k)
		}
	}
	if w.after > 0 {
		w.watchMember(busy, now)
	}
}

// entry returns the watch's entry for st's partition, new for a partition
// just assigned. A new assignment of a partition the watch already knows
// (assigned again between two looks, or a Kafka-scope rewind) keeps its
// idle period and its schedule.
func (w *idleWatch) entry(st *partState, now time.Time) *idleEntry {
	k := tp{st.Topic, st.Partition}
	e := w.parts[k]
	switch {
	case e == nil:
		e = &idleEntry{st: st, polled: st.polledTo.Load(), active: now, due: now.Add(w.interval)}
		w.parts[k] = e
	case e.st != st:
		// The earlier assignment's periodic call was dropped or is
		// stopping; the new one's are scheduled afresh.
		e.st, e.polled, e.running = st, st.polledTo.Load(), nil
	}
	e.gen = w.gen
	return e
}

// watch updates e's activity and, when call is set, calls Idle.Partition
// when it has been idle for After. It reports whether the partition had
// records since the last look, or has some unfinished.
func (w *idleWatch) watch(e *idleEntry, now time.Time, call bool) bool {
	if w.r.userPaused(e.st) {
		// Its quiet is the pause's, not the topic's: it is idle only
		// After past its resume.
		e.active, e.fired = now, false
		return false
	}
	if p := e.st.polledTo.Load(); p != e.polled || e.st.Watermark.Pending() > 0 {
		e.polled, e.active, e.fired = p, now, false
		return true
	}
	if e.fired || now.Sub(e.active) < w.after {
		return false
	}
	e.fired = true
	if fn := w.r.cfg.Idle.Partition; fn != nil && call {
		st, since := e.st, e.active
		w.call(st.RevokedCh(), "partition", func(ctx context.Context) { fn(ctx, st.Topic, st.Partition, since) },
			"topic", st.Topic, "partition", st.Partition)
	}
	return false
}

// watchMember calls Idle.Member when no partition has had a record for
// After.
func (w *idleWatch) watchMember(busy bool, now time.Time) {
	if busy {
		w.memberActive, w.memberFired = now, false
		return
	}
	if w.memberFired || now.Sub(w.memberActive) < w.after {
		return
	}
	w.memberFired = true
	if fn := w.r.cfg.Idle.Member; fn != nil {
		since := w.memberActive
		w.call(nil, "member", func(ctx context.Context) { fn(ctx, since) })
	}
}

// call runs an idle call on a goroutine of its own, under a context that
// ends with the session or when gone is closed (a partition's revoke).
func (w *idleWatch) call(gone <-chan struct{}, what string, fn func(ctx context.Context), attrs ...any) {
	ctx, cancel := context.WithCancel(w.ctx)
	w.calls.Add(2)
	go func() {
		defer w.calls.Done()
		select {
		case <-gone:
			cancel()
		case <-ctx.Done():
		}
	}()
	go func() {
		defer w.calls.Done()
		defer cancel()
		if err := scope.Call(func() error { fn(ctx); return nil }); err != nil {
			w.r.log.Error("kscope: the "+what+" idle call (Config.Idle) panicked", append(attrs, "err", err)...)
		}
	}()
}

// periodic schedules e's periodic work when it is due and its last call
// returned.
func (w *idleWatch) periodic(e *idleEntry, now time.Time) {
	if now.Before(e.due) || (e.running != nil && e.running.Load()) || e.st.Revoked() {
		return
	}
	e.due = now.Add(w.interval)
	e.running = new(atomic.Bool)
	e.running.Store(true)
	w.r.schedulePeriodic(e.st, e.running, w.run)
}

// ownTopic reports whether topic is one of kscope's own the runner
// consumes besides the service's topics (a retry topic, a delay topic):
// its partitions count for the member's activity, but get no idle or
// periodic calls of their own.
func (r *Runner) ownTopic(topic string) bool {
	_, delayed := r.delays[topic]
	return delayed && !slices.Contains(r.cfg.Topics, topic)
}

// schedulePeriodic queues one periodic call for st's partition on its
// key-shard worker (that of the partition's null-key records), where it
// runs under the assignment as a record does: the drain of a revoke or a
// stop waits for it, and a revoke drops it while queued. running is
// cleared once it returned.
func (r *Runner) schedulePeriodic(st *partState, running *atomic.Bool, run func(ctx context.Context, topic string, partition int32) error) {
	shard := partition.Shard(st.Topic, st.Partition, -1, nil, r.cfg.Shards, NullKeyOrdered)
	task := func(ctx context.Context, rec *Record) {
		defer running.Store(false)
		if ctx.Err() != nil || rec.Revoked() || r.runCtx.Err() != nil {
			return // the partition's revoke or the runner's stop began
		}
		err := scope.Call(func() error { return run(ctx, st.Topic, st.Partition) })
		switch {
		case err == nil:
			r.idle.runs.Add(1)
		case ctx.Err() != nil || rec.Revoked():
			r.log.Info("kscope: periodic work stopped by the partition's revoke or the runner's stop", "topic", st.Topic, "partition", st.Partition, "err", err)
		default:
			r.idle.errors.Add(1)
			r.log.Warn("kscope: periodic work failed; it runs again at the next interval", "topic", st.Topic, "partition", st.Partition, "err", err)
		}
	}
	rec := &Record{Record: &kgo.Record{Topic: st.Topic, Partition: st.Partition, Offset: -1}, part: st, shard: int32(shard), state: recDone, task: task}
	r.pool.Dispatch(shard, st.Assignment, rec)
}
