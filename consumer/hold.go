package consumer

import (
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/commit"
)

// hold keeps rec back when it is a delay-topic record that is not due yet,
// when an earlier record of its partition is held, or, in a transactional
// runner, when commit.MaxUndone records of its partition are dispatched
// and not done. It reports whether it kept it. The caller holds
// st.holdMu until the records of the poll that it did not keep are
// dispatched: a held record released meanwhile (its due time came, or a
// dispatch slot freed) would otherwise reach its key-shard before earlier
// records of its partition.
func (r *Runner) hold(st *partState, rec *Record, now time.Time) bool {
	// The due time is read once, when the record arrives, and clamped
	// then: a forged far-future time waits at most maxDelay.
	if maxDelay, ok := r.delays[rec.Topic]; ok {
		if due, ok := dueOf(rec, now, maxDelay); ok {
			rec.due = due.UnixNano()
		}
	}
	if len(st.held) > 0 {
		st.held = append(st.held, rec) // behind a held record: partition order
		r.keepHeld(rec)
		return true
	}
	if r.txs != nil && st.active.Load() >= commit.MaxUndone {
		st.held = append(st.held, rec) // released as records finish (releaseSlots)
		r.keepHeld(rec)
		r.setHoldPaused(st, true)
		return true
	}
	if rec.due == 0 {
		return false
	}
	due := time.Unix(0, rec.due)
	if !due.After(now) {
		return false
	}
	st.held = append(st.held, rec)
	r.keepHeld(rec)
	r.heldDue.Add(1)
	r.setHoldPaused(st, true)
	st.holdTimer = time.AfterFunc(due.Sub(now), func() { r.releaseHeld(st) })
	return true
}

// releaseHeld dispatches the held records of st that are due (and, in a
// transactional runner, have a dispatch slot), in order, and arms the
// timer for the next one, or resumes the partition when none is left.
func (r *Runner) releaseHeld(st *partState) {
	st.holdMu.Lock()
	defer st.holdMu.Unlock()
	r.releaseHeldLocked(st)
}

// releaseHeldLocked is releaseHeld with st.holdMu held.
func (r *Runner) releaseHeldLocked(st *partState) {
	if st.Revoked() {
		return // dropHeld took care of them
	}
	if st.holdTimer != nil {
		st.holdTimer.Stop()
		st.holdTimer = nil
	}
	var now time.Time // read once, when a held record has a due time
	i := 0
	for ; i < len(st.held); i++ {
		rec := st.held[i]
		if r.txs != nil && st.active.Load() >= commit.MaxUndone {
			break // released as records finish
		}
		if rec.due != 0 {
			if now.IsZero() {
				now = time.Now()
			}
			due := time.Unix(0, rec.due)
			if due.After(now) {
				st.holdTimer = time.AfterFunc(due.Sub(now), func() { r.releaseHeld(st) })
				break
			}
			r.lateness.observe(now.Sub(due))
			r.obs.Lateness(rec.Topic, now.Sub(due))
		}
		r.unkeepHeld(rec)
		if r.txs != nil {
			st.active.Add(1)
		}
		r.pool.Dispatch(int(rec.shard), st.Assignment, rec)
		st.held[i] = nil
	}
	st.held = st.held[i:]
	if len(st.held) == 0 {
		st.held = nil
		r.setHoldPaused(st, false)
	}
	r.settleMarkersLocked(st)
}

// markersPolled is markersPolledLocked for a poll that brought st only
// transaction markers.
func (r *Runner) markersPolled(st *partState, markers []int64) {
	st.holdMu.Lock()
	defer st.holdMu.Unlock()
	if st.Revoked() {
		return // dropHeld may have run already; the next owner passes them
	}
	r.markersPolledLocked(st, markers)
}

// markersPolledLocked takes the transaction markers, in offset order, that
// one poll of a transactional runner's partition brought, after the poll's
// records were dispatched or held: those below every held record of the
// partition count as done at once, the others once the held records
// before them are dispatched (releaseHeld).
//
// A marker counted done above held records would make every transaction
// list each of them as undone in the offset's metadata, and records are
// held by the thousand: past commit.MaxUndone dispatched, or waiting for
// their due time on a retry topic, which the Kafka scope writes in
// transactions, a marker after each record it sends there. Metadata that
// long is refused by the broker (offset.metadata.max.bytes, 4096 bytes by
// default), so every transaction would abort, and again after each
// rewind. Kept back, a marker leaves below it only dispatched records
// undone: at most commit.MaxUndone. st.holdMu must be held.
func (r *Runner) markersPolledLocked(st *partState, markers []int64) {
	st.heldMarkers = append(st.heldMarkers, markers...)
	if r.settleMarkersLocked(st) {
		// The Kafka scope commits offsets only in a transaction: a
		// marker alone in a poll (an input transaction that aborted,
		// once the runner caught up) must end one too. (A marker
		// settled later by releaseHeld follows a record dispatched
		// then, whose transaction ends anyway.)
		r.txs.TxnProgress()
	}
}

// settleMarkersLocked counts done the kept markers of st that lie below
// its lowest held record (all of them when none is held) and reports
// whether there were any. st.holdMu must be held.
func (r *Runner) settleMarkersLocked(st *partState) bool {
	i := len(st.heldMarkers)
	if len(st.held) > 0 {
		i, _ = slices.BinarySearch(st.heldMarkers, st.held[0].offset)
	}
	if i == 0 {
		return false
	}
	st.Watermark.DoneAll(st.heldMarkers[:i])
	if st.heldMarkers = st.heldMarkers[i:]; len(st.heldMarkers) == 0 {
		st.heldMarkers = nil
	}
	return true
}

// releaseSlots dispatches held records of a transactional runner's
// partition once records finished and freed dispatch slots, unless a timer
// waits for a held record's due time. Records finish one by one, so it
// runs for nearly every record: it returns at once when no slot is free
// (the records that took them call it again as they finish), and takes
// st.holdMu once.
func (r *Runner) releaseSlots(st *partState) {
	if st.active.Load() >= commit.MaxUndone {
		return
	}
	st.holdMu.Lock()
	if len(st.held) > 0 && st.holdTimer == nil {
		r.releaseHeldLocked(st)
	}
	st.holdMu.Unlock()
}

// dropHeld forgets the held records of a revoked or lost partition: its next
// owner consumes them again.
func (r *Runner) dropHeld(st *partState) {
	r.keys().dropPart() // and the records its keys' breakers hold
	st.holdMu.Lock()
	defer st.holdMu.Unlock()
	if st.holdTimer != nil {
		st.holdTimer.Stop()
		st.holdTimer = nil
	}
	for _, rec := range st.held {
		r.held.Add(-1)
		rec.state = recDone // its in-flight room was given back when it was kept
	}
	st.held, st.heldMarkers = nil, nil
}

// keepHeld counts rec as held. A held record does not count against the
// in-flight bound: its partition is paused, so what is held is at most one
// fetch's worth per delay-topic partition, and a backlog of retry records
// waiting for a distant due time must not stop the source topics.
func (r *Runner) keepHeld(rec *Record) {
	r.held.Add(1)
	r.releaseN(1, rec.size)
}

// unkeepHeld takes rec's in-flight room back as it goes to its key-shard.
func (r *Runner) unkeepHeld(rec *Record) {
	r.held.Add(-1)
	r.inflight.Add(1)
	r.inflightBytes.Add(rec.size)
}

// dueOf reads the due time a delay-topic record carries (HeaderDue). ok is
// false when the record has no due time or an unreadable one: it is due
// now. A due time up to twice maxDelay ahead is clamped to now+maxDelay (a
// producer whose clock runs somewhat ahead); one further out cannot have
// been written by a runner whose clock agrees with this one within the
// delay, so it is treated as due now. The result depends only on the
// header while the header's time comes nearer, so a record whose due time
// is read again after a rewind (the Kafka scope) is never held longer than
// its clamped time: a forged or corrupt far-future time cannot block its
// partition.
func dueOf(rec *Record, now time.Time, maxDelay time.Duration) (time.Time, bool) {
	return dueOfKafka(rec.Record, now, maxDelay)
}

// dueOfKafka is dueOf for a record the poll returned.
func dueOfKafka(rec *kgo.Record, now time.Time, maxDelay time.Duration) (time.Time, bool) {
	var v []byte
	ok := false
	for i := len(rec.Headers) - 1; i >= 0 && !ok; i-- { // the last one, as Record.Header
		if rec.Headers[i].Key == HeaderDue {
			v, ok = rec.Headers[i].Value, true
		}
	}
	if !ok {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || ms < 0 {
		return time.Time{}, false
	}
	due := time.UnixMilli(ms)
	switch {
	case due.After(now.Add(2 * maxDelay)):
		return now, true
	case due.After(now.Add(maxDelay)):
		return now.Add(maxDelay), true
	}
	return due, true
}

// LatenessBuckets are the upper bounds of the RetryLateness histogram.
var LatenessBuckets = []time.Duration{
	10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 5 * time.Second, 30 * time.Second,
}

// Lateness is a histogram of how long after their due time held records
// were released to their key-shard: Counts[i] counts releases at most
// LatenessBuckets[i] late; the last count is for later ones.
type Lateness struct {
	Counts [8]int64
	Max    time.Duration
}

type latenessHist struct {
	mu sync.Mutex
	h  Lateness
}

func (l *latenessHist) observe(d time.Duration) {
	d = max(d, 0)
	l.mu.Lock()
	defer l.mu.Unlock()
	i := 0
	for i < len(LatenessBuckets) && d > LatenessBuckets[i] {
		i++
	}
	l.h.Counts[i]++
	l.h.Max = max(l.h.Max, d)
}

func (l *latenessHist) snapshot() Lateness {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h
}
