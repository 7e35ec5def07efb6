package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/partition"
	"github.com/kscope-dev/kscope/scope"
)

// The holds of keys kept in memory (scope.HoldInMemory: the AtLeastOnce
// and Kafka scopes). A held key's records wait in its queue, in offset
// order, not done (its partition's offset is not committed past them) and
// counted against the in-flight bounds. Every record of a key in one
// partition runs on one key-shard worker, and so does the key's release:
// the records of the key that reach the worker while it is held join the
// queue's end (Engine.Call turns them away before their handler), and
// none runs while the release runs.

// heldKey is one key held in memory.
type heldKey struct {
	recs   []*Record // waiting, oldest first
	failed int       // probes that failed in a row
	since  time.Time
	pool   *partition.Pool[*Record] // the key-shard workers its records run on
	// gen counts the timers armed and releases begun: a timer or a
	// release of an earlier gen does nothing.
	gen uint64
}

// bind lets kb hold records in r's memory when r's scope asks for it.
func (kb *keyBreaker) bind(r *Runner) {
	if kb == nil {
		return
	}
	kb.r, kb.log = r, r.log
	if h, ok := r.unit.(scope.KeyHolder); ok {
		kb.inMemory = h.KeyHolds() == scope.HoldInMemory
	}
}

// useKeyBreaker binds the runner's key breaker to its scope s, which must
// say who keeps the records of a held key (scope.KeyHolder).
func (r *Runner) useKeyBreaker(s workScope) error {
	if r.kb == nil {
		return nil
	}
	h, ok := s.(scope.KeyHolder)
	if !ok || (h.KeyHolds() != scope.HoldInMemory && h.KeyHolds() != scope.HoldInScope) {
		return &ConfigError{Field: "KeyBreaker", Reason: fmt.Sprintf("is set for scope %T, which cannot hold one key's records alone "+
			"(a batch handler, whose calls take the records of many keys at once, or a scope that does not implement scope.KeyHolder); "+
			"use a per-record handler, or leave KeyBreaker nil", s)}
	}
	r.kb.bind(r)
	return nil
}

// keys returns the runner's key breaker when it keeps held records in
// memory, else nil.
func (r *Runner) keys() *keyBreaker {
	if r.kb != nil && r.kb.inMemory {
		return r.kb
	}
	return nil
}

// heldNow reports whether r's key is held in memory and r is not being
// given back from its hold: then r waits behind the key's held records.
func (kb *keyBreaker) heldNow(r *Record) bool {
	if kb == nil || !kb.inMemory || kb.nheld.Load() == 0 || r.keyRelease || r.Key == nil {
		return false
	}
	kb.mu.Lock()
	_, held := kb.held[keyOf(r)]
	kb.mu.Unlock()
	return held
}

// hold keeps rec in its key's hold: at the queue's front when it was being
// given back (a probe, or a record after it, that failed again), else at
// its end. d > 0 (a failure that opened the breaker, or a failed probe)
// sets the time until the key's next probe.
func (kb *keyBreaker) hold(rec *Record, d time.Duration) {
	k := keyOf(rec)
	defer kb.report()
	kb.mu.Lock()
	defer kb.mu.Unlock()
	h := kb.held[k]
	if h == nil {
		h = &heldKey{since: time.Now()}
		kb.held[k] = h
		kb.nheld.Store(int32(len(kb.held)))
		if d == 0 {
			d = kb.cfg.OpenFor // its hold ended meanwhile (its partition was revoked)
		}
	}
	h.pool = kb.r.pool // the current session's
	if rec.keyRelease {
		h.recs = append([]*Record{rec}, h.recs...)
	} else {
		h.recs = append(h.recs, rec)
	}
	if rec.keyProbe > 0 {
		h.failed = int(rec.keyProbe)
	}
	rec.state, rec.keyRelease, rec.keyProbe = recKeyHeld, false, 0
	if d > 0 {
		kb.arm(k, h, d)
	}
}

// arm calls due for k after d, and makes every earlier timer and release
// of k do nothing. kb.mu is held.
func (kb *keyBreaker) arm(k keyID, h *heldKey, d time.Duration) {
	h.gen++
	g := h.gen
	time.AfterFunc(d, func() { kb.due(k, g) })
}

// due starts the release of key k, its cool-down over: a task on the
// key-shard worker of its oldest record, under that record's assignment.
// A key with no record left (its partition revoked) is no longer held.
// Should the task be dropped (its assignment revoked before it ran), due
// runs again after OpenFor.
func (kb *keyBreaker) due(k keyID, g uint64) {
	defer kb.report()
	kb.mu.Lock()
	h := kb.held[k]
	if h == nil || h.gen != g {
		kb.mu.Unlock()
		return
	}
	kb.dropRevoked(h)
	if len(h.recs) == 0 {
		kb.unhold(k)
		kb.mu.Unlock()
		return
	}
	head := h.recs[0]
	kb.arm(k, h, kb.cfg.OpenFor)
	g = h.gen
	pool := h.pool
	kb.mu.Unlock()
	task := func(ctx context.Context, _ *Record) { kb.release(ctx, k, g) }
	t := &Record{Record: &kgo.Record{Topic: head.Topic, Partition: head.Partition, Key: head.Key, Offset: -1}, part: head.part, shard: head.shard, state: recDone, task: task}
	pool.Dispatch(int(head.shard), head.part.Assignment, t)
}

// release gives key k's held records back to the scope, on their
// key-shard worker: the oldest as the key's probe, then, while they
// succeed (or fail in a way the breaker does not match), the rest in
// order. It ends when one of them holds the key again, when the runner
// stops, or when none is left: the key is then no longer held. Records of
// a revoked partition are dropped, for its next owner.
func (kb *keyBreaker) release(ctx context.Context, k keyID, g uint64) {
	defer kb.report()
	probe := true
	for {
		kb.mu.Lock()
		h := kb.held[k]
		if h == nil || h.gen != g {
			kb.mu.Unlock()
			return // released already, or held again
		}
		if probe {
			h.gen++ // due's fallback timer does nothing now
			g = h.gen
		}
		kb.dropRevoked(h)
		if len(h.recs) == 0 {
			kb.unhold(k)
			kb.mu.Unlock()
			return
		}
		if ctx.Err() != nil {
			kb.arm(k, h, kb.cfg.OpenFor)
			kb.mu.Unlock()
			return // stopping: the stop drops the records
		}
		rec := h.recs[0]
		h.recs = h.recs[1:]
		rec.state, rec.keyRelease = recPending, true
		if probe {
			kb.keyProbe(rec, h.failed)
		} else {
			h.failed = 0
		}
		kb.mu.Unlock()
		kb.r.processRecords(ctx, []*Record{rec})
		probe = false
	}
}

// report tells the hooks (hook.KeyHoldHook) how many keys are held, when
// that changed since the last report. kb.mu is not held: a hook may read
// Stats.
func (kb *keyBreaker) report() {
	n := kb.nheld.Load()
	if kb.reported.Swap(n) == n {
		return
	}
	for _, h := range kb.hooks {
		if kh, ok := h.(hook.KeyHoldHook); ok {
			kh.OnKeyHold(hook.KeyHold{Group: kb.group, Keys: int(n)})
		}
	}
}

// dropRevoked forgets h's records of revoked partition assignments and
// gives their in-flight room back. kb.mu is held.
func (kb *keyBreaker) dropRevoked(h *heldKey) {
	keep := h.recs[:0]
	for _, rec := range h.recs {
		if !rec.Revoked() {
			keep = append(keep, rec)
			continue
		}
		rec.state = recDone
		kb.r.releaseN(1, rec.size)
	}
	clear(h.recs[len(keep):])
	h.recs = keep
}

// unhold ends key k's hold. kb.mu is held.
func (kb *keyBreaker) unhold(k keyID) {
	h := kb.held[k]
	delete(kb.held, k)
	kb.nheld.Store(int32(len(kb.held)))
	h.gen++
	kb.log.LogAttrs(context.Background(), slog.LevelInfo, "kscope: key released by its circuit breaker", slog.String("topic", k.topic),
		slog.Int("partition", int(k.partition)), slog.String("key", keyText([]byte(k.key))), slog.Duration("held_for", time.Since(h.since).Round(time.Millisecond)))
}

// dropPart forgets the held records of revoked or rewound partition
// assignments: its next owner (or this member, after a Kafka transaction's
// abort) consumes them again. Their keys stay held until their probe is
// due, so that the records delivered again wait too.
func (kb *keyBreaker) dropPart() {
	if kb == nil || !kb.inMemory {
		return
	}
	kb.mu.Lock()
	defer kb.mu.Unlock()
	for _, h := range kb.held {
		kb.dropRevoked(h)
	}
}
