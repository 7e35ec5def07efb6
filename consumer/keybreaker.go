package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/ratelog"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Defaults of a KeyBreakerConfig.
const (
	DefaultKeyBreakerFailures   = 3                // KeyBreakerConfig.Failures: retrytopic.DefaultInPlaceAttempts
	DefaultKeyBreakerWindow     = time.Minute      // KeyBreakerConfig.Window
	DefaultKeyBreakerOpenFor    = 30 * time.Second // KeyBreakerConfig.OpenFor
	DefaultKeyBreakerMaxOpenFor = 10 * time.Minute // KeyBreakerConfig.MaxOpenFor
	DefaultKeyBreakerMaxKeys    = 10000            // KeyBreakerConfig.MaxKeys
)

// KeyBreakerConfig is the circuit breaker of each key (Config.KeyBreaker):
// a key (a tenant, an account) whose records keep failing is held alone
// while every other key flows and commits. Failures of a key's records
// that Trips matches, Failures of them within Window, open its breaker:
// the record that failed and every later record of its key wait, not
// sent to a retry topic or the dead-letter topic, their offsets not
// committed past (in the AtLeastOnce and Kafka scopes) or stored in
// PostgreSQL (the DB scope). After OpenFor one record of the key, the
// oldest, goes through as its probe: if it succeeds the key's held records
// run in order, before any newer one; if it fails with an error Trips
// matches, the key is held again for twice as long, up to MaxOpenFor; a
// failure Trips does not match follows the failure policy, and the key's
// other records go on. Records without a key are never held. See
// docs/flow-control.md#per-key-circuit-breaker.
type KeyBreakerConfig struct {
	// Trips reports whether a handler error counts against its record's
	// key. nil: every failure of class retryable or unknown (a terminal
	// failure or a skip is the record's own, and follows the failure
	// policy). A failure a dependency breaker (Config.Breakers) matches
	// is that dependency's, and never counts here.
	Trips func(err error) bool
	// Failures is how many matching failures of one key within Window
	// open its breaker. Keep it at most Failures.InPlaceAttempts
	// (default 3), so that a record failing alone holds its key on its
	// last attempt in place rather than going on to a retry topic or the
	// dead-letter topic. Default DefaultKeyBreakerFailures.
	Failures int
	// Window is how far back a key's failures count. Default
	// DefaultKeyBreakerWindow.
	Window time.Duration
	// OpenFor is how long a key is held before its first probe. Default
	// DefaultKeyBreakerOpenFor.
	OpenFor time.Duration
	// MaxOpenFor bounds the hold between two probes, which doubles after
	// each failed probe. Default DefaultKeyBreakerMaxOpenFor.
	MaxOpenFor time.Duration
	// MaxKeys bounds the keys whose recent failures are remembered; past
	// it the oldest are forgotten (a key that fails rarely is not held).
	// Held keys are bounded by the in-flight limits (MaxInFlightRecords:
	// the AtLeastOnce and Kafka scopes keep held records in memory) or
	// not at all (the DB scope keeps them in PostgreSQL). Default
	// DefaultKeyBreakerMaxKeys.
	MaxKeys int
}

// KeyBreakerStats counts the work of the circuit breaker of each key
// (Config.KeyBreaker), in [Stats].KeyBreaker, in every scope. HeldKeys
// and HeldRecords count the holds kept in memory (the AtLeastOnce and
// Kafka scopes); the DB scope's live in PostgreSQL (DBStats).
type KeyBreakerStats struct {
	HeldKeys     int   // keys held now
	HeldRecords  int   // their records, waiting in memory
	Holds        int64 // times a key was held (a failed probe counts again)
	Probes       int64 // probes run
	FailedProbes int64 // probes that failed and held their key again
}

// validateKeyBreaker checks c.KeyBreaker and reports each problem to bad.
func (c Config) validateKeyBreaker(bad func(field, format string, args ...any)) {
	k := c.KeyBreaker
	if k == nil {
		return
	}
	if k.Failures < 0 {
		bad("KeyBreaker.Failures", "is %d; set it to a positive count (0 selects %d)", k.Failures, DefaultKeyBreakerFailures)
	}
	for _, d := range []struct {
		field  string
		v, def time.Duration
	}{{"Window", k.Window, DefaultKeyBreakerWindow}, {"OpenFor", k.OpenFor, DefaultKeyBreakerOpenFor}, {"MaxOpenFor", k.MaxOpenFor, DefaultKeyBreakerMaxOpenFor}} {
		if d.v < 0 {
			bad("KeyBreaker."+d.field, "is %s; set it to a positive duration (0 selects %s)", d.v, d.def)
		}
	}
	if k.OpenFor > 0 && k.MaxOpenFor > 0 && k.MaxOpenFor < k.OpenFor {
		bad("KeyBreaker.MaxOpenFor", "is %s, less than OpenFor (%s); set it to at least OpenFor", k.MaxOpenFor, k.OpenFor)
	}
	if k.MaxKeys < 0 {
		bad("KeyBreaker.MaxKeys", "is %d; set it to a positive count (0 selects %d)", k.MaxKeys, DefaultKeyBreakerMaxKeys)
	}
}

// errKeyHeld turns away, before its handler, a record whose key is held
// in memory: Decide holds it behind the key's earlier records.
var errKeyHeld = errors.New("kscope: the record's key is held by its circuit breaker")

// keyID names a key in one partition.
type keyID struct {
	topic     string
	partition int32
	key       string
}

func keyOf(r *Record) keyID { return keyID{r.Topic, r.Partition, string(r.Key)} }

// keyBreaker is the circuit breaker of each key; nil without
// Config.KeyBreaker.
type keyBreaker struct {
	cfg KeyBreakerConfig

	mu    sync.Mutex
	fails map[keyID][]time.Time // each key's matching failures within Window
	held  map[keyID]*heldKey    // the keys held in memory (keyhold.go)

	nheld        atomic.Int32 // len(held): the fast path of a record whose key is not held
	reported     atomic.Int32 // nheld as last reported to the hooks
	holds        atomic.Int64
	probes       atomic.Int64
	failedProbes atomic.Int64

	// Set by bind.
	r        *Runner
	inMemory bool // the runner keeps held records (scope.HoldInMemory)
	log      *slog.Logger
	logs     *ratelog.Limiter
	hooks    []hook.Hook
	group    string
}

// newKeyBreaker returns cfg's key breaker, or nil without one.
func newKeyBreaker(cfg Config) *keyBreaker {
	if cfg.KeyBreaker == nil {
		return nil
	}
	c := *cfg.KeyBreaker
	if c.Failures == 0 {
		c.Failures = DefaultKeyBreakerFailures
	}
	if c.Window == 0 {
		c.Window = DefaultKeyBreakerWindow
	}
	if c.OpenFor == 0 {
		c.OpenFor = DefaultKeyBreakerOpenFor
	}
	if c.MaxOpenFor == 0 {
		c.MaxOpenFor = max(DefaultKeyBreakerMaxOpenFor, c.OpenFor)
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultKeyBreakerMaxKeys
	}
	return &keyBreaker{cfg: c, fails: map[keyID][]time.Time{}, held: map[keyID]*heldKey{}, log: cfg.Logger, logs: ratelog.New(10, 10*time.Second), hooks: cfg.Hooks, group: cfg.Group}
}

// trips reports whether err counts against its record's key.
func (kb *keyBreaker) trips(f *failures, err error) (match bool) {
	if kb.cfg.Trips == nil {
		c := f.classOf(err)
		return c == retrytopic.ClassRetryable || c == retrytopic.ClassUnknown
	}
	defer func() {
		if p := recover(); p != nil {
			kb.log.Error("kscope: KeyBreaker.Trips panicked; the error does not count against its key", "panic", fmt.Sprint(p))
			match = false
		}
	}()
	return kb.cfg.Trips(err)
}

// coolDown is the hold before a key's next probe, after failed probes.
func (kb *keyBreaker) coolDown(failed int) time.Duration {
	d := kb.cfg.OpenFor
	for i := 0; i < failed && d < kb.cfg.MaxOpenFor; i++ {
		d *= 2
	}
	return min(d, kb.cfg.MaxOpenFor)
}

// decide returns the hold step for rec's failure err when it holds rec's
// key (ok), counting it against the key.
func (kb *keyBreaker) decide(f *failures, rec *Record, err error) (retrytopic.Step, bool) {
	if kb == nil || rec.Key == nil {
		return retrytopic.Step{}, false
	}
	if !kb.trips(f, err) {
		return retrytopic.Step{}, false
	}
	class := f.classOf(err)
	if rec.keyProbe > 0 {
		failed := int(rec.keyProbe)
		kb.failedProbes.Add(1)
		st := retrytopic.Step{Action: retrytopic.ActionHold, Class: class, Delay: kb.coolDown(failed)}
		kb.heldEvent(f, rec, err, st.Delay)
		return st, true
	}
	if !kb.count(keyOf(rec), time.Now()) {
		return retrytopic.Step{}, false
	}
	st := retrytopic.Step{Action: retrytopic.ActionHold, Class: class, Delay: kb.cfg.OpenFor}
	kb.heldEvent(f, rec, err, st.Delay)
	return st, true
}

// count adds a failure of key at now and reports whether the key's
// failures within Window reached Failures (they are then forgotten).
func (kb *keyBreaker) count(k keyID, now time.Time) bool {
	kb.mu.Lock()
	defer kb.mu.Unlock()
	ts := kb.fails[k]
	keep := ts[:0]
	for _, t := range ts {
		if now.Sub(t) < kb.cfg.Window {
			keep = append(keep, t)
		}
	}
	keep = append(keep, now)
	if len(keep) >= kb.cfg.Failures {
		delete(kb.fails, k)
		return true
	}
	if len(kb.fails) >= kb.cfg.MaxKeys {
		kb.forget(now)
	}
	kb.fails[k] = keep
	return false
}

// forget drops the keys whose last failure is past Window, then, while
// there are still MaxKeys, any. kb.mu is held.
func (kb *keyBreaker) forget(now time.Time) {
	for k, ts := range kb.fails {
		if len(ts) == 0 || now.Sub(ts[len(ts)-1]) >= kb.cfg.Window {
			delete(kb.fails, k)
		}
	}
	for k := range kb.fails {
		if len(kb.fails) < kb.cfg.MaxKeys {
			break
		}
		delete(kb.fails, k)
	}
}

// keyProbe marks rec as its key's probe after failed failed probes.
func (kb *keyBreaker) keyProbe(rec *Record, failed int) {
	if kb == nil {
		return
	}
	kb.probes.Add(1)
	rec.keyProbe = int16(min(failed, 1<<14)) + 1
}

// KeyProbe implements scope.Failures.
func (f *failures) KeyProbe(rec *Record, failed int) { f.calls.keys.keyProbe(rec, failed) }

// stats returns the key breaker's counters.
func (kb *keyBreaker) stats() KeyBreakerStats {
	if kb == nil {
		return KeyBreakerStats{}
	}
	kb.mu.Lock()
	st := KeyBreakerStats{HeldKeys: len(kb.held)}
	for _, h := range kb.held {
		st.HeldRecords += len(h.recs)
	}
	kb.mu.Unlock()
	st.Holds, st.Probes, st.FailedProbes = kb.holds.Load(), kb.probes.Load(), kb.failedProbes.Load()
	return st
}

// heldEvent reports that rec's failure err held its key until its probe
// in d.
func (kb *keyBreaker) heldEvent(f *failures, rec *Record, err error, d time.Duration) {
	kb.holds.Add(1)
	f.obs.Event(rec, hook.EventKeyHeld, fmt.Sprint(err))
	kb.logs.Log(context.Background(), kb.log, slog.LevelWarn, "kscope: key held by its circuit breaker: its records wait, the other keys go on", "key held",
		slog.String("topic", rec.Topic), slog.Int("partition", int(rec.Partition)), slog.Int64("offset", rec.Offset),
		slog.String("key", keyText(rec.Key)), slog.String("id", f.identity.Of(rec)), slog.Any("err", err), slog.Duration("probe_in", d))
}

// keyText is a key as a log line shows it: at most 64 bytes, quoted.
func keyText(k []byte) string {
	if len(k) > 64 {
		return fmt.Sprintf("%q…", k[:64])
	}
	return fmt.Sprintf("%q", k)
}
