package consumer

import (
	"container/list"
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// DefaultRateKeys is how many keys' limiters RateLimit.PerKey keeps by
// default (RateLimit.Keys).
const DefaultRateKeys = 10_000

// Rate is one rate limit: a token bucket that refills PerSecond tokens a
// second and holds at most Burst.
type Rate struct {
	// PerSecond is the sustained rate; 0: no limit.
	PerSecond float64
	// Burst is how many tokens may be taken at once after an idle
	// spell: the bucket's size. Default 1 for records (an even pace,
	// no burst), one second's worth (PerSecond) for bytes. A record or
	// batch that needs more than Burst takes them in turns.
	Burst int
}

// RateLimit bounds how fast handlers are called, in every scope. Each
// limit set is taken before each handler call (a retry in place is a
// call too; a batch handler's call takes a token per record), on the
// record's key-shard: the wait holds the key-shard, and counts neither as
// a stall (Config.StallWarning) nor against Config.HandlerTimeout. The
// wait sleeps on a timer (no busy loop) and ends early when the record's
// context ends (shutdown, or a revoke's DrainTimeout passing): the record
// is then not done, and is delivered again. See docs/flow-control.md for
// how a wait meets the Kafka scope's transaction timeout and the drain of
// a revoke.
type RateLimit struct {
	// Records bounds the runner's handler calls: records per second.
	Records Rate
	// Bytes bounds the key, value and header bytes the runner's handler
	// calls take, a second.
	Bytes Rate
	// PerTopic bounds the handler calls of each topic named, records per
	// second, on top of Records. A topic's wait holds its key-shard, so
	// the records of other topics queued behind it on that key-shard
	// wait too.
	PerTopic map[string]Rate
	// PerKey bounds the handler calls of each key (of each topic),
	// records per second. Records without a key are not limited per
	// key. A key's wait holds its key-shard, so the other keys of the
	// key-shard wait behind it.
	PerKey Rate
	// Keys is how many keys' limiters PerKey keeps: past it, the least
	// recently used key's is dropped (a key idle for Burst/PerSecond has
	// a full bucket anyway, so dropping it changes nothing). Default
	// DefaultRateKeys; only with PerKey.
	Keys int
}

// set reports whether any limit is set.
func (l RateLimit) set() bool {
	return l.Records.PerSecond > 0 || l.Bytes.PerSecond > 0 || len(l.PerTopic) > 0 || l.PerKey.PerSecond > 0
}

// validateRateLimit checks c.RateLimit and reports each problem to bad.
func (c Config) validateRateLimit(bad func(field, format string, args ...any)) {
	l := c.RateLimit
	checkRate("RateLimit.Records", l.Records, bad)
	checkRate("RateLimit.Bytes", l.Bytes, bad)
	checkRate("RateLimit.PerKey", l.PerKey, bad)
	for t, r := range l.PerTopic {
		if t == "" {
			bad("RateLimit.PerTopic", "holds a limit for an empty topic name; remove it or name the topic")
		}
		checkRate("RateLimit.PerTopic["+t+"]", r, bad)
		if r.PerSecond <= 0 {
			bad("RateLimit.PerTopic["+t+"]", "has no PerSecond; set a positive rate or remove the topic's entry")
		}
	}
	if l.Keys < 0 {
		bad("RateLimit.Keys", "is %d; set it to a positive count (0 selects %d)", l.Keys, DefaultRateKeys)
	} else if l.Keys > 0 && l.PerKey.PerSecond <= 0 {
		bad("RateLimit.Keys", "is set without RateLimit.PerKey, which it bounds; set PerKey too, or leave Keys at 0")
	}
}

func checkRate(field string, r Rate, bad func(field, format string, args ...any)) {
	if r.PerSecond < 0 || math.IsNaN(r.PerSecond) || math.IsInf(r.PerSecond, 0) {
		bad(field+".PerSecond", "is %v; set it to a positive rate a second (0: no limit)", r.PerSecond)
	}
	if r.Burst < 0 {
		bad(field+".Burst", "is %d; set it to a positive count (0 selects the default)", r.Burst)
	} else if r.Burst > 0 && r.PerSecond == 0 {
		bad(field+".Burst", "is set without PerSecond; set PerSecond too, or leave Burst at 0")
	}
}

// limits are a runner's rate limiters (Config.RateLimit); nil without
// any.
type limits struct {
	records, bytes *rate.Limiter
	topics         map[string]*rate.Limiter
	keys           *keyLimiters

	waits  atomic.Int64 // handler calls that waited
	waited atomic.Int64 // nanoseconds waited, in all
}

// newLimits returns the limiters of l, or nil when it sets none.
func newLimits(l RateLimit) *limits {
	if !l.set() {
		return nil
	}
	ls := &limits{records: limiter(l.Records, 1), bytes: limiter(l.Bytes, int(min(l.Bytes.PerSecond, math.MaxInt32)))}
	if len(l.PerTopic) > 0 {
		ls.topics = make(map[string]*rate.Limiter, len(l.PerTopic))
		for t, r := range l.PerTopic {
			ls.topics[t] = limiter(r, 1)
		}
	}
	if l.PerKey.PerSecond > 0 {
		n := l.Keys
		if n == 0 {
			n = DefaultRateKeys
		}
		ls.keys = &keyLimiters{rate: l.PerKey, max: n, m: make(map[string]*list.Element)}
	}
	return ls
}

// limiter returns r's limiter, with burst def when r sets none; nil
// without a rate.
func limiter(r Rate, def int) *rate.Limiter {
	if r.PerSecond <= 0 {
		return nil
	}
	b := r.Burst
	if b == 0 {
		b = max(def, 1)
	}
	return rate.NewLimiter(rate.Limit(r.PerSecond), b)
}

// take waits until every limit lets the handler call of rs (one record,
// or one batch of a partition) go, and returns nil; or the context's
// error, its reservations given back, when ctx ends first. The wait is
// a timer's: the worker sleeps, and the stall watch takes it for a
// chosen wait (doneBuf.wait), not a stall.
func (l *limits) take(ctx context.Context, rs []*Record) error {
	if l == nil || len(rs) == 0 {
		return nil
	}
	now := time.Now()
	var buf [4]*rate.Reservation
	res := buf[:0]
	reserve := func(lim *rate.Limiter, n int) {
		if lim == nil {
			return
		}
		// A limiter gives at most its burst at once: more is taken
		// in turns, each after the one before.
		for b := lim.Burst(); n > 0; n -= b {
			res = append(res, lim.ReserveN(now, min(n, b)))
		}
	}
	reserve(l.records, len(rs))
	if l.bytes != nil {
		var b int64
		for _, r := range rs {
			b += r.size
		}
		reserve(l.bytes, int(min(b, math.MaxInt32)))
	}
	reserve(l.topics[rs[0].Topic], len(rs))
	if l.keys != nil {
		for _, r := range rs {
			if r.Key != nil {
				reserve(l.keys.get(r.Topic, r.Key), 1)
			}
		}
	}
	var delay time.Duration
	for _, r := range res {
		delay = max(delay, r.DelayFrom(now))
	}
	if delay <= 0 {
		return nil
	}
	l.waits.Add(1)
	return l.sleep(ctx, rs[0], delay, res)
}

// sleep waits out delay on a timer, on rec's key-shard, marked as a wait
// for the stall watch; when ctx ends first it gives res back.
func (l *limits) sleep(ctx context.Context, rec *Record, delay time.Duration, res []*rate.Reservation) error {
	if d := waitingBuf(rec); d != nil {
		d.wait(true)
		defer d.wait(false)
	}
	start := time.Now()
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		l.waited.Add(int64(time.Since(start)))
		return nil
	case <-ctx.Done():
		for _, r := range res {
			r.Cancel()
		}
		l.waited.Add(int64(time.Since(start)))
		return fmt.Errorf("kscope: waiting for Config.RateLimit before the handler call: %w", ctx.Err())
	}
}

// keyLimiters are the per-key limiters, the most recently used first, at
// most max of them.
type keyLimiters struct {
	rate Rate
	max  int

	mu  sync.Mutex
	m   map[string]*list.Element
	lru list.List // of *keyLimiter
}

type keyLimiter struct {
	key string
	lim *rate.Limiter
}

// get returns the limiter of key of topic, made on first use; it drops
// the least recently used one past max.
func (k *keyLimiters) get(topic string, key []byte) *rate.Limiter {
	id := topic + "\x00" + string(key)
	k.mu.Lock()
	defer k.mu.Unlock()
	if e, ok := k.m[id]; ok {
		k.lru.MoveToFront(e)
		return e.Value.(*keyLimiter).lim
	}
	kl := &keyLimiter{key: id, lim: limiter(k.rate, 1)}
	k.m[id] = k.lru.PushFront(kl)
	for k.lru.Len() > k.max {
		last := k.lru.Back()
		k.lru.Remove(last)
		delete(k.m, last.Value.(*keyLimiter).key)
	}
	return kl.lim
}

// size returns how many keys' limiters are kept.
func (k *keyLimiters) size() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lru.Len()
}

// RateStats are the rate limits' counters (Config.RateLimit), in
// [Stats].RateLimit.
type RateStats struct {
	Waits  int64         // handler calls that waited for a limit
	Waited time.Duration // how long they waited, in all
	Keys   int           // keys whose limiter RateLimit.PerKey keeps now
}

func (l *limits) stats() RateStats {
	if l == nil {
		return RateStats{}
	}
	s := RateStats{Waits: l.waits.Load(), Waited: time.Duration(l.waited.Load())}
	if l.keys != nil {
		s.Keys = l.keys.size()
	}
	return s
}

// callStats fills in st's counters of what the runner does around the
// handler call: its admission rules, its rate limits, and the pauses.
func (r *Runner) callStats(st *Stats) {
	r.obs.admissionStats(st)
	st.Paused = r.Paused()
	r.stopMu.Lock()
	f := r.failures
	r.stopMu.Unlock()
	if f != nil {
		st.RateLimit = f.calls.limits.stats()
		st.Breakers = f.calls.breakers.states()
	}
}
