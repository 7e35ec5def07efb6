package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kscope-dev/kscope/hook"
)

// Defaults of a BreakerConfig.
const (
	DefaultBreakerFailures = 5                // BreakerConfig.Failures
	DefaultBreakerWindow   = 10 * time.Second // BreakerConfig.Window
	DefaultBreakerOpenFor  = 30 * time.Second // BreakerConfig.OpenFor
)

// BreakerConfig is a circuit breaker of one dependency (Config.Breakers),
// in every scope. The handler errors Trips matches feed it: Failures of
// them within Window open it. While it is open the runner's whole
// pipeline waits: fetching is paused (a pause of [All] with reason
// "breaker <Name>", see [Runner.Pause]), no handler call starts, and a
// record whose call fails with a matching error while it is open (the
// one that opened it too) is neither retried through the failure policy
// nor sent to a retry topic or the dead-letter topic: it waits in place on
// its key-shard, its retry budget untouched, its offset not committed,
// and is called again when the breaker lets it. After OpenFor the breaker
// is half-open: fetching resumes and one call (the probe) goes through
// while the others wait; its success (or a failure Trips does not match)
// closes the breaker, a matching failure opens it again for OpenFor. A
// wait ends early when the record's context ends (shutdown, or a revoke's
// DrainTimeout passing): the record is then not done and is delivered
// again. See docs/flow-control.md#circuit-breakers.
type BreakerConfig struct {
	// Name names the breaker in the log lines, Stats.Breakers, the pause's
	// reason and the kscope_breaker_state metric. Required, unique.
	Name string
	// Trips reports whether a handler error is a failure of the
	// breaker's dependency (say, errors.Is(err, ErrPaymentsDown)).
	// Required.
	Trips func(err error) bool
	// Failures is how many matching failures within Window open the
	// breaker. Default DefaultBreakerFailures.
	Failures int
	// Window is how far back failures count. Default DefaultBreakerWindow.
	Window time.Duration
	// OpenFor is how long the breaker stays open before it lets a probe
	// through. Default DefaultBreakerOpenFor.
	OpenFor time.Duration
}

// BreakerStatus is where a circuit breaker stands.
type BreakerStatus int

const (
	// BreakerClosed lets every handler call go (the normal state).
	BreakerClosed BreakerStatus = iota
	// BreakerHalfOpen lets one probe call go; the others wait.
	BreakerHalfOpen
	// BreakerOpen lets no handler call go, and fetching is paused.
	BreakerOpen
)

// String returns "closed", "half-open" or "open".
func (s BreakerStatus) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return fmt.Sprintf("BreakerStatus(%d)", int(s))
}

// BreakerState is a circuit breaker's state, in [Stats].Breakers.
type BreakerState struct {
	Name  string
	State BreakerStatus
	Since time.Time // when it entered State (zero: closed since the start)
	Trips int64     // how many times it opened
}

// validateBreakers checks c.Breakers and reports each problem to bad.
func (c Config) validateBreakers(bad func(field, format string, args ...any)) {
	seen := map[string]bool{}
	for i, b := range c.Breakers {
		field := fmt.Sprintf("Breakers[%d]", i)
		switch {
		case b.Name == "":
			bad(field+".Name", "is empty; name the breaker's dependency")
		case seen[b.Name]:
			bad(field+".Name", "is %q, the name of an earlier breaker; give each breaker its own name", b.Name)
		}
		seen[b.Name] = true
		if b.Trips == nil {
			bad(field+".Trips", "is nil; set it to a function that reports whether a handler error is a failure of the dependency")
		}
		if b.Failures < 0 {
			bad(field+".Failures", "is %d; set it to a positive count (0 selects %d)", b.Failures, DefaultBreakerFailures)
		}
		if b.Window < 0 {
			bad(field+".Window", "is %s; set it to a positive duration (0 selects %s)", b.Window, DefaultBreakerWindow)
		}
		if b.OpenFor < 0 {
			bad(field+".OpenFor", "is %s; set it to a positive duration (0 selects %s)", b.OpenFor, DefaultBreakerOpenFor)
		}
	}
}

// breakers are a runner's circuit breakers (Config.Breakers); nil without
// any.
type breakers struct {
	list  []*breaker
	group string
	log   *slog.Logger
	hooks []hook.Hook
	// pause pauses (on) or resumes the runner's fetching for reason; set
	// by bind.
	pause func(reason string, on bool)
}

// breaker is one circuit breaker.
type breaker struct {
	cfg BreakerConfig
	bs  *breakers

	mu      sync.Mutex
	state   BreakerStatus
	since   time.Time
	trips   int64
	fails   []time.Time   // the matching failures within Window, while closed
	probing bool          // the half-open probe's call is out
	changed chan struct{} // closed and replaced when a waiting call may go on
}

// newBreakers returns the breakers of cfg, or nil without any.
func newBreakers(cfg Config) *breakers {
	if len(cfg.Breakers) == 0 {
		return nil
	}
	bs := &breakers{group: cfg.Group, log: cfg.Logger, hooks: cfg.Hooks}
	for _, c := range cfg.Breakers {
		if c.Failures == 0 {
			c.Failures = DefaultBreakerFailures
		}
		if c.Window == 0 {
			c.Window = DefaultBreakerWindow
		}
		if c.OpenFor == 0 {
			c.OpenFor = DefaultBreakerOpenFor
		}
		bs.list = append(bs.list, &breaker{cfg: c, bs: bs, changed: make(chan struct{})})
	}
	return bs
}

// bind lets the breakers pause and resume r's fetching, and log on its
// logger.
func (bs *breakers) bind(r *Runner) {
	if bs == nil {
		return
	}
	bs.log = r.log
	bs.pause = func(reason string, on bool) {
		if on {
			r.Pause(All(), PauseReason(reason)) //nolint:errcheck // All is a valid target, and the pause is not persisted
			return
		}
		r.Resume(All(), PauseReason(reason)) //nolint:errcheck // as above
	}
}

// run makes rec's handler call (or its batch's) through the breakers:
// it waits while one is open (or half-open with its probe out), then
// calls, and feeds the call's outcome to them. A failure that leaves a
// matching breaker open (Decide turns it into a wait in place) is
// returned as it is: the scope undoes the call's work as for any failure
// (a transaction's savepoint, the Kafka scope's outputs), and the next
// call of the record waits here.
func (bs *breakers) run(ctx context.Context, rec *Record, call func() error) error {
	if bs == nil {
		return call()
	}
	probes, err := bs.admit(ctx, rec)
	if err != nil {
		return err
	}
	err = call()
	bs.done(probes, err)
	return err
}

// holds reports whether err is a failure a breaker that is not closed
// matches: the record waits in place, outside the failure policy.
func (bs *breakers) holds(err error) bool {
	if bs == nil || err == nil {
		return false
	}
	for _, b := range bs.list {
		b.mu.Lock()
		closed := b.state == BreakerClosed
		b.mu.Unlock()
		if !closed && b.matches(err) {
			return true
		}
	}
	return false
}

// admit waits until every breaker lets a call go, and returns those of
// which the call is the half-open probe.
func (bs *breakers) admit(ctx context.Context, rec *Record) ([]*breaker, error) {
	var probes []*breaker
	for _, b := range bs.list {
		probe, err := b.admit(ctx, rec)
		if err != nil {
			for _, p := range probes {
				p.release()
			}
			return nil, err
		}
		if probe {
			probes = append(probes, b)
		}
	}
	return probes, nil
}

// admit waits until b lets a call go, and reports whether the call is its
// probe.
func (b *breaker) admit(ctx context.Context, rec *Record) (bool, error) {
	marked := false
	defer func() {
		if marked {
			waitingBuf(rec).wait(false)
		}
	}()
	for {
		b.mu.Lock()
		switch {
		case b.state == BreakerClosed:
			b.mu.Unlock()
			return false, nil
		case b.state == BreakerHalfOpen && !b.probing:
			b.probing = true
			b.mu.Unlock()
			return true, nil
		}
		ch := b.changed
		b.mu.Unlock()
		if d := waitingBuf(rec); d != nil && !marked {
			d.wait(true) // a breaker's wait is not a stall
			marked = true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false, fmt.Errorf("kscope: waiting for circuit breaker %q before the handler call: %w", b.cfg.Name, ctx.Err())
		}
	}
}

// release gives back a probe that did not run.
func (b *breaker) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	b.wake()
}

// done feeds a call's outcome to the breakers (probes: those of which it
// was the probe).
func (bs *breakers) done(probes []*breaker, err error) {
	for _, b := range bs.list {
		b.done(slices.Contains(probes, b), err)
	}
}

// done feeds one call's outcome to b, and reports whether the call's
// failure is one b, not closed now, matches.
func (b *breaker) done(probe bool, err error) bool {
	match := err != nil && b.matches(err)
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if probe {
		b.probing = false
		if match {
			b.open(now, err)
			return true
		}
		b.to(BreakerClosed, now, nil)
		b.bs.pauseFor(b, false)
		return false
	}
	if !match {
		return false
	}
	if b.state != BreakerClosed {
		return true
	}
	keep := b.fails[:0]
	for _, t := range b.fails {
		if now.Sub(t) < b.cfg.Window {
			keep = append(keep, t)
		}
	}
	b.fails = append(keep, now)
	if len(b.fails) < b.cfg.Failures {
		return false
	}
	b.open(now, err)
	return true
}

// matches asks the breaker's Trips about err; a panic in it is no match.
func (b *breaker) matches(err error) (match bool) {
	defer func() {
		if p := recover(); p != nil {
			b.bs.log.Error("kscope: a circuit breaker's Trips panicked; the error counts as no failure of its dependency", "breaker", b.cfg.Name, "panic", fmt.Sprint(p))
			match = false
		}
	}()
	return b.cfg.Trips(err)
}

// open opens b for OpenFor after err: it pauses fetching, and turns
// half-open when OpenFor passed. b.mu is held.
func (b *breaker) open(now time.Time, err error) {
	b.trips++
	b.fails = nil
	b.to(BreakerOpen, now, err)
	b.bs.pauseFor(b, true)
	time.AfterFunc(b.cfg.OpenFor, b.halfOpen)
}

// halfOpen turns an open breaker half-open: fetching resumes and one
// probe call may go.
func (b *breaker) halfOpen() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != BreakerOpen {
		return
	}
	b.to(BreakerHalfOpen, time.Now(), nil)
	b.bs.pauseFor(b, false)
}

// to moves b to state s, logs the change once and tells the hooks, and
// wakes the waiting calls. b.mu is held.
func (b *breaker) to(s BreakerStatus, now time.Time, err error) {
	if b.state == s {
		return
	}
	b.state, b.since = s, now
	b.wake()
	attrs := []slog.Attr{slog.String("breaker", b.cfg.Name), slog.String("state", s.String())}
	switch s {
	case BreakerOpen:
		attrs = append(attrs, slog.Any("err", err), slog.Duration("open_for", b.cfg.OpenFor), slog.Int64("trips", b.trips))
		b.bs.log.LogAttrs(context.Background(), slog.LevelWarn, "kscope: circuit breaker open: handler calls wait and fetching is paused", attrs...)
	case BreakerHalfOpen:
		b.bs.log.LogAttrs(context.Background(), slog.LevelInfo, "kscope: circuit breaker half-open: one probe call goes through", attrs...)
	default:
		b.bs.log.LogAttrs(context.Background(), slog.LevelInfo, "kscope: circuit breaker closed: handler calls go on", attrs...)
	}
	for _, h := range b.bs.hooks {
		if bh, ok := h.(hook.BreakerHook); ok {
			bh.OnBreaker(hook.Breaker{Group: b.bs.group, Name: b.cfg.Name, State: s.String(), Since: now, Err: err})
		}
	}
}

// wake lets the waiting calls look at b again. b.mu is held.
func (b *breaker) wake() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// pauseFor pauses (on) or resumes fetching for b.
func (bs *breakers) pauseFor(b *breaker, on bool) {
	if bs.pause != nil {
		bs.pause("breaker "+b.cfg.Name, on)
	}
}

// states returns the breakers' states, in Config.Breakers' order.
func (bs *breakers) states() []BreakerState {
	if bs == nil {
		return nil
	}
	out := make([]BreakerState, len(bs.list))
	for i, b := range bs.list {
		b.mu.Lock()
		out[i] = BreakerState{Name: b.cfg.Name, State: b.state, Since: b.since, Trips: b.trips}
		b.mu.Unlock()
	}
	return out
}

// breakerWait reports whether rec's failure err waits in place for a
// circuit breaker (then Decide's step is a retry in place with no delay:
// the record's next call waits at the breaker), and returns attempt less
// the attempts that waited so: a wait uses up none of the retry budget.
func (f *failures) breakerWait(rec *Record, err error, attempt int) (int, bool) {
	if f.calls.breakers.holds(err) {
		rec.breakerWaits++
		return attempt, true
	}
	return max(attempt-int(rec.breakerWaits), 1), false
}
