package consumer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kscope-dev/kscope/hook"
)

// DefaultStallWarning is how long a key-shard may finish none of its
// records before the runner says so (Config.StallWarning).
const DefaultStallWarning = time.Minute

// stallTick is the most time between two looks of the stall watch.
const stallTick = time.Second

// shardWatch is what the stall watch knows of one key-shard.
type shardWatch struct {
	batches  uint64 // the doneBuf's counts and call marks when last seen
	finished int
	call     int64
	again    uint64
	since    time.Time // when they were first seen so
	stalled  bool      // reported stalled, not yet ended
	rec      stallRec  // the record reported
}

// stallRec is the record a stalled key-shard holds, copied under the
// doneBuf's lock.
type stallRec struct {
	topic     string
	partition int32
	offset    int64
	key       []byte // cut to maxLoggedKey bytes
	id        string // its identity (Config.Identity)
	inHandler bool   // the scope said its handler runs (scope.Engine.Handling)
	batch     int    // records in the worker's batch
}

// watchStalls looks at every key-shard at least every stallTick until ctx
// ends, and reports one that has held a batch for Config.StallWarning
// without finishing a record of it: a handler that does not return (a call
// with no timeout that ignores its context) stalls every key of its
// key-shard, and, once the in-flight bound fills behind it, the whole
// consumer, with nothing else naming the record. A stall reported is ended
// when the key-shard moves on, or when the watch stops.
func (r *Runner) watchStalls(ctx context.Context) {
	limit := r.cfg.StallWarning
	if limit <= 0 {
		return
	}
	t := time.NewTicker(min(limit/4, stallTick))
	defer t.Stop()
	ws := make([]shardWatch, len(r.doneBufs))
	defer func() {
		now := time.Now()
		for i := range ws {
			if ws[i].stalled {
				r.endStall(i, &ws[i], now, "the runner stopped")
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for i, d := range r.doneBufs {
				r.lookAt(i, d, &ws[i], now)
			}
		}
	}
}

// lookAt updates w, the watch of key-shard i, from its doneBuf, and
// reports a stall when it has lasted Config.StallWarning, or its end.
func (r *Runner) lookAt(i int, d *doneBuf, w *shardWatch, now time.Time) {
	d.mu.Lock()
	busy := d.batch != nil && !d.waiting
	batches, finished, call, again := d.batches, d.finished, d.call.Load(), d.again.Load()
	still := batches == w.batches && finished == w.finished && call == w.call && again == w.again
	var rec stallRec
	if busy && !w.stalled && still && now.Sub(w.since) >= r.cfg.StallWarning {
		rec = d.heldLocked(r.cfg.Identity)
	}
	d.mu.Unlock()

	switch {
	case !busy || !still:
		if w.stalled {
			r.endStall(i, w, now, "")
		}
		*w = shardWatch{batches: batches, finished: finished, call: call, again: again, since: now}
	case rec.batch > 0:
		w.stalled, w.rec = true, rec
		r.stalled.Add(1)
		what := "its handler has not returned, or the scope's work for it (its transaction, the routing of its failure) has not ended"
		if rec.inHandler {
			what = "its handler has not returned"
		}
		r.log.Warn("kscope: a key-shard has finished no record for StallWarning: "+what+"; every other key of the key-shard waits behind it, and the partition's offsets do not move past it",
			"shard", i, "topic", rec.topic, "partition", rec.partition, "offset", rec.offset, "key", string(rec.key), "id", rec.id,
			"stalled_for", now.Sub(w.since).Round(time.Millisecond), "batch_records", rec.batch)
		r.obs.Stall(hook.Stall{Shard: i, Topic: rec.topic, Partition: rec.partition, Offset: rec.offset, For: now.Sub(w.since)})
	}
}

// heldLocked returns the record the worker's batch holds: the one whose
// handler runs, when the scope says (scope.Engine.Handling); else the first of
// the batch not done (the scopes that do not say report records done in
// order as they handle them). d.mu is held and d.batch is not nil.
func (d *doneBuf) heldLocked(ident Identity) stallRec {
	held := d.batch[min(d.finished, len(d.batch)-1)]
	handling := d.callingLocked()
	if handling != nil {
		held = handling
	}
	key := held.Key
	if len(key) > maxLoggedKey {
		key = key[:maxLoggedKey]
	}
	return stallRec{topic: held.Topic, partition: held.Partition, offset: held.offset,
		key: append([]byte(nil), key...), id: ident.Of(held), inHandler: handling != nil, batch: len(d.batch)}
}

// running describes the records the key-shards' workers hold now, those
// of the partitions in sts only when sts is not nil, at most five: for a
// drain that a handler outlasts, so that the log names what it waits for.
func (r *Runner) running(sts []*partState) string {
	var out []string
	more := 0
	for _, d := range r.doneBufs {
		d.mu.Lock()
		if d.batch == nil || (sts != nil && !slices.Contains(sts, d.batch[0].part)) {
			d.mu.Unlock()
			continue
		}
		h := d.heldLocked(r.cfg.Identity)
		d.mu.Unlock()
		if len(out) == 5 {
			more++
			continue
		}
		out = append(out, fmt.Sprintf("%s[%d]@%d key %q", h.topic, h.partition, h.offset, h.key))
	}
	s := strings.Join(out, ", ")
	if more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}

// endStall reports the end of key-shard i's stall.
func (r *Runner) endStall(i int, w *shardWatch, now time.Time, why string) {
	w.stalled = false
	r.stalled.Add(-1)
	d := now.Sub(w.since)
	msg := "kscope: a stalled key-shard moved on"
	if why != "" {
		msg = "kscope: a stalled key-shard is no longer watched: " + why
	}
	r.log.Info(msg, "shard", i, "topic", w.rec.topic, "partition", w.rec.partition, "offset", w.rec.offset, "id", w.rec.id,
		"stalled_for", d.Round(time.Millisecond))
	r.obs.Stall(hook.Stall{Shard: i, Topic: w.rec.topic, Partition: w.rec.partition, Offset: w.rec.offset, For: d, Ended: true})
}

// handling marks rec's handler as running (scope.Engine.Handling), for a scope
// that reports its records done only once their batch's transaction
// commits: the stall watch then names the record whose handler has not
// returned, rather than the first of the batch. handled marks it returned.
func handling(rec *Record) {
	if rec.part != nil && rec.part.bufs != nil {
		rec.part.bufs[rec.shard].handlerCall(rec, true)
	}
}

func handled(rec *Record) {
	if rec.part != nil && rec.part.bufs != nil {
		rec.part.bufs[rec.shard].handlerCall(rec, false)
	}
}

// waitingBuf returns the doneBuf of rec's key-shard, for a wait between
// two rounds of retries (Rounds), or nil.
func waitingBuf(rec *Record) *doneBuf {
	if rec == nil || rec.part == nil || rec.part.bufs == nil {
		return nil
	}
	return rec.part.bufs[rec.shard]
}
