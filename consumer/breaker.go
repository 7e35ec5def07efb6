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
	DefaultBreakerFailures = 3                // BreakerConfig.Failures: retrytopic.DefaultInPlaceAttempts
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
	// breaker. Until it opens, failures follow the failure policy: keep
	// it at most Failures.InPlaceAttempts (default 3), so that a record
	// failing alone opens the breaker on its last attempt in place
	// rather than going on to a retry topic or the dead-letter topic.
	// Default DefaultBreakerFailures.
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

	ctl     sync.Mutex // held while a change of state is made and carried out (report), in turn
	mu      sync.Mutex // guards the fields below; never held while calling out
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
		case <-revokedCh(rec):
			// A revoke does not wait for a call that has not started: the
			// partition's next owner handles the record.
			return false, fmt.Errorf("kscope: waiting for circuit breaker %q before the handler call: the record's partition was revoked", b.cfg.Name)
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

// done feeds one call's outcome to b.
func (b *breaker) done(probe bool, err error) {
	match := err != nil && b.matches(err)
	if !probe && !match {
		return
	}
	b.ctl.Lock()
	defer b.ctl.Unlock()
	b.mu.Lock()
	now := time.Now()
	var to transition
	switch {
	case probe && match:
		b.probing = false
		to = b.open(now, err)
	case probe:
		b.probing = false
		to = b.to(BreakerClosed, now, nil)
	case b.state == BreakerClosed:
		keep := b.fails[:0]
		for _, t := range b.fails {
			if now.Sub(t) < b.cfg.Window {
				keep = append(keep, t)
			}
		}
		b.fails = append(keep, now)
		if len(b.fails) >= b.cfg.Failures {
			to = b.open(now, err)
		}
	}
	b.mu.Unlock()
	b.report(to)
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

// open opens b after err, and turns it half-open when OpenFor passed.
// b.ctl and b.mu are held.
func (b *breaker) open(now time.Time, err error) transition {
	b.trips++
	b.fails = nil
	time.AfterFunc(b.cfg.OpenFor, b.halfOpen)
	return b.to(BreakerOpen, now, err)
}

// halfOpen turns an open breaker half-open: fetching resumes and one
// probe call may go.
func (b *breaker) halfOpen() {
	b.ctl.Lock()
	defer b.ctl.Unlock()
	b.mu.Lock()
	var to transition
	if b.state == BreakerOpen {
		to = b.to(BreakerHalfOpen, time.Now(), nil)
	}
	b.mu.Unlock()
	b.report(to)
}

// transition is a change of a breaker's state, to report.
type transition struct {
	changed bool
	state   BreakerStatus
	since   time.Time
	err     error
	trips   int64
}

// to moves b to state s and wakes the waiting calls; it returns the
// change, for report. b.ctl and b.mu are held.
func (b *breaker) to(s BreakerStatus, now time.Time, err error) transition {
	if b.state == s {
		return transition{}
	}
	b.state, b.since = s, now
	b.wake()
	return transition{changed: true, state: s, since: now, err: err, trips: b.trips}
}

// report carries out a change of b's state: it pauses fetching (open) or
// resumes it, logs the change once and tells the hooks. b.ctl is held
// (the changes are carried out in their order), b.mu is not (a hook may
// read Stats).
func (b *breaker) report(t transition) {
	if !t.changed {
		return
	}
	b.bs.pauseFor(b, t.state == BreakerOpen)
	attrs := []slog.Attr{slog.String("breaker", b.cfg.Name), slog.String("state", t.state.String())}
	switch t.state {
	case BreakerOpen:
		attrs = append(attrs, slog.Any("err", t.err), slog.Duration("open_for", b.cfg.OpenFor), slog.Int64("trips", t.trips))
		b.bs.log.LogAttrs(context.Background(), slog.LevelWarn, "kscope: circuit breaker open: handler calls wait and fetching is paused", attrs...)
	case BreakerHalfOpen:
		b.bs.log.LogAttrs(context.Background(), slog.LevelInfo, "kscope: circuit breaker half-open: one probe call goes through", attrs...)
	default:
		b.bs.log.LogAttrs(context.Background(), slog.LevelInfo, "kscope: circuit breaker closed: handler calls go on", attrs...)
	}
	for _, h := range b.bs.hooks {
		if bh, ok := h.(hook.BreakerHook); ok {
			bh.OnBreaker(hook.Breaker{Group: b.bs.group, Name: b.cfg.Name, State: t.state.String(), Since: t.since, Err: t.err})
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
	return spent(rec, attempt), false
}

// spent returns attempt, the attempts of rec made on this hop, less those
// that waited in place for a circuit breaker.
func spent(rec *Record, attempt int) int {
	if rec.breakerWaits == 0 {
		return attempt
	}
	return max(attempt-int(rec.breakerWaits), 1)
}
