package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/dlreason"
	"github.com/kscope-dev/kscope/internal/guard"
	"github.com/kscope-dev/kscope/internal/handlerchain"
	"github.com/kscope-dev/kscope/internal/ratelog"
	"github.com/kscope-dev/kscope/retrytopic"
)

// ErrFiltered is matched (errors.Is) by the error of a record that
// Config.Keep filtered out: the error, of class skip, that its delivery
// ends with (hook.RecordEnd.Err, outcome hook.OutcomeFiltered).
var ErrFiltered = errors.New("kscope: record filtered out by Config.Keep")

// ErrExpired is matched (errors.Is) by the error of a record older than
// Config.MaxAge: of class skip (outcome hook.OutcomeExpired) or terminal
// (dead-lettered, the dead-letter record's kscope-error header says it
// expired), as Config.Expired says.
var ErrExpired = dlreason.ErrExpired

// ErrHandlerTimeout is matched (errors.Is) by the error of a handler call
// that failed after its deadline (Config.HandlerTimeout, or a scope's
// Timeout middleware) passed. The error also matches the handler's own
// error, and is of its class, or retryable when it has none.
var ErrHandlerTimeout = handlerchain.ErrTimeout

// DefaultHandlerGrace is how long a handler call may run on past
// Config.HandlerTimeout before the runner reports it (Config.HandlerGrace).
const DefaultHandlerGrace = 5 * time.Second

// ExpiredAction says what becomes of a record older than Config.MaxAge.
type ExpiredAction int

const (
	// ExpiredDeadLetter sends an expired record to the dead-letter topic
	// with its failure metadata, as a terminal failure (the default).
	ExpiredDeadLetter ExpiredAction = iota
	// ExpiredSkip skips an expired record: not handled, its offset
	// committed, outcome hook.OutcomeExpired.
	ExpiredSkip
)

// String returns the action's name.
func (a ExpiredAction) String() string {
	switch a {
	case ExpiredDeadLetter:
		return "ExpiredDeadLetter"
	case ExpiredSkip:
		return "ExpiredSkip"
	}
	return fmt.Sprintf("ExpiredAction(%d)", int(a))
}

// callRules are the runner's rules for a handler call: admission
// (Config.Keep, MaxAge, Expired) and the deadline (HandlerTimeout,
// HandlerGrace).
type callRules struct {
	group      string
	retryName  string // the prefix of the group's retry topics' names
	keep       func(*Record) bool
	maxAge     time.Duration
	expired    ExpiredAction
	timeout    time.Duration
	grace      time.Duration
	limits     *limits          // Config.RateLimit; nil without one
	breakers   *breakers        // Config.Breakers; nil without any
	keys       *keyBreaker      // Config.KeyBreaker; nil without one
	expiredLog *ratelog.Limiter // one INFO line per expired skip, up to a burst per window
	owner      string           // Config.Owner, written on every routed record
	// maxDeliveries is a share group's ShareConfig.MaxDeliveries; 0 for a
	// consumer group.
	maxDeliveries int32
}

// newCallRules returns cfg's rules for a handler call.
func newCallRules(cfg Config) callRules {
	return callRules{group: cfg.Group, retryName: retrytopic.SafeName(cfg.Group) + ".kscope-retry-", keep: cfg.Keep, maxAge: cfg.MaxAge, expired: cfg.Expired,
		timeout: cfg.HandlerTimeout, grace: cfg.HandlerGrace, limits: newLimits(cfg.RateLimit), breakers: newBreakers(cfg), keys: newKeyBreaker(cfg), expiredLog: ratelog.New(10, 10*time.Second),
		owner: cfg.Owner, maxDeliveries: shareMaxDeliveries(cfg)}
}

// validateHandlerCall checks the handler call's fields and reports each
// problem to bad.
func (c Config) validateHandlerCall(bad func(field, format string, args ...any)) {
	if c.HandlerTimeout < 0 {
		bad("HandlerTimeout", "is %s; set it to a positive duration (0: no deadline)", c.HandlerTimeout)
	}
	if c.HandlerGrace < 0 {
		bad("HandlerGrace", "is %s; set it to a positive duration (0 selects %s)", c.HandlerGrace, DefaultHandlerGrace)
	} else if c.HandlerGrace > 0 && c.HandlerTimeout <= 0 {
		bad("HandlerGrace", "is set without HandlerTimeout, which it extends; set HandlerTimeout too, or leave HandlerGrace at 0")
	}
	if c.MaxAge < 0 {
		bad("MaxAge", "is %s; set it to a positive duration (0: records never expire)", c.MaxAge)
	}
	switch {
	case c.Expired != ExpiredDeadLetter && c.Expired != ExpiredSkip:
		bad("Expired", "is %s; use ExpiredDeadLetter or ExpiredSkip", c.Expired)
	case c.Expired != ExpiredDeadLetter && c.MaxAge <= 0:
		bad("Expired", "is %s without MaxAge, which decides what expires; set MaxAge too, or leave Expired at its zero value", c.Expired)
	}
}

// Admit implements scope.Engine: the admission rules (Config.Keep,
// MaxAge) applied to r before its handler runs.
func (e engineOf) Admit(r *Record) error { return e.f.admit(r) }

// Call implements scope.Engine: admission, then Config.RateLimit's wait
// (not a stall, not under HandlerTimeout), then the call, through the
// circuit breakers (Config.Breakers). The AtLeastOnce scope skips Call
// and f.call when directCalls says none of their features is configured:
// a feature added to either must turn directCalls off.
func (e engineOf) Call(ctx context.Context, r *Record, call func(ctx context.Context) error) error {
	if e.f.calls.keys.heldNow(r) {
		return errKeyHeld
	}
	if err := e.f.admit(r); err != nil {
		return err
	}
	if l := e.f.calls.limits; l != nil {
		rs := [1]*Record{r}
		if err := l.take(ctx, rs[:]); err != nil {
			return err
		}
	}
	if e.f.calls.breakers == nil {
		return e.f.call(ctx, r, call)
	}
	return e.f.calls.breakers.run(ctx, r, func() error { return e.f.call(ctx, r, call) })
}

// CallBatch implements scope.Engine.
func (e engineOf) CallBatch(ctx context.Context, rs []*Record, call func(ctx context.Context) error) error {
	if len(rs) == 0 {
		return nil
	}
	if err := e.f.calls.limits.take(ctx, rs); err != nil {
		return err
	}
	if e.f.calls.breakers == nil {
		return e.f.call(ctx, rs[0], call)
	}
	return e.f.calls.breakers.run(ctx, rs[0], func() error { return e.f.call(ctx, rs[0], call) })
}

// errFiltered is the error of every filtered record: one value, so that a
// filter that drops most records costs no allocation per record.
var errFiltered = retrytopic.Skip(ErrFiltered)

// Why the admission rules turned a record away (Record.turned).
const (
	admitted uint8 = iota
	turnedFiltered
	turnedExpired
)

// admit returns why r is turned away before its handler, or nil, and notes
// it on r, for its delivery's end: a scope may end it without the error.
func (f *failures) admit(r *Record) error {
	c := &f.calls
	if c.keep == nil && c.maxAge <= 0 && c.maxDeliveries == 0 {
		return nil
	}
	err := c.admission(f, r)
	switch {
	case err == nil:
		r.turned = admitted
	case errors.Is(err, ErrFiltered):
		r.turned = turnedFiltered
	case errors.Is(err, ErrExpired):
		r.turned = turnedExpired
	}
	return err
}

// admission applies the rules to r: Keep, then MaxAge.
func (c *callRules) admission(f *failures, r *Record) error {
	if err := c.deliveries(f, r); err != nil {
		return err
	}
	retried := false
	if strings.HasPrefix(r.Topic, c.retryName) {
		_, retried = retrytopic.RetryTopicDelay(c.group, r.Topic)
	}
	if c.keep != nil && !retried {
		keep, err := c.kept(r)
		if err != nil {
			return err
		}
		if !keep {
			return errFiltered
		}
	}
	if c.maxAge <= 0 {
		return nil
	}
	ts := r.Timestamp
	if retried {
		if o := f.Metadata(r).OriginalTimestamp; !o.IsZero() {
			ts = o
		}
	}
	if ts.UnixMilli() <= 0 {
		return nil // no timestamp: nothing to judge its age by
	}
	if age := time.Since(ts); age > c.maxAge {
		err := fmt.Errorf("%w: its timestamp %s is %s old, past MaxAge %s", ErrExpired, ts.UTC().Format(time.RFC3339Nano), age.Round(time.Millisecond), c.maxAge)
		if c.expired == ExpiredSkip {
			return retrytopic.Skip(err)
		}
		return retrytopic.Terminal(err)
	}
	return nil
}

// kept asks Config.Keep about r; a panic in it is r's failure.
func (c *callRules) kept(r *Record) (keep bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = guard.Recovered("kscope: Config.Keep panicked: ", p)
		}
	}()
	return c.keep(r), nil
}

// admission reports whether err turned a record away before its handler:
// an admission rule's decision, which a user's Failures.Classify does not
// reclassify.
func admission(err error) bool {
	return errors.Is(err, ErrFiltered) || errors.Is(err, ErrExpired) || errors.Is(err, ErrDeliveriesExhausted)
}

// classOf classifies err under the policy; an admission error keeps its
// own class.
func (f *failures) classOf(err error) Class {
	if f.policy.Classify != nil && admission(err) {
		return retrytopic.ClassOf(err)
	}
	return f.policy.ClassOf(err)
}

// skippedByAdmission logs the skip of a record an admission rule turned
// away, and reports whether it was one: a filtered record is logged at
// DEBUG only (a filter drops many records by design), an expired one at
// INFO, a burst per window. Neither counts as a business skip; the
// observer counts them (Stats.Filtered, Stats.Expired).
func (f *failures) skippedByAdmission(ctx context.Context, rec *Record, err error) bool {
	switch {
	case errors.Is(err, ErrFiltered):
		if f.log.Enabled(ctx, slog.LevelDebug) { // a filter drops many records: no attributes built for a line not logged
			f.log.LogAttrs(ctx, slog.LevelDebug, "kscope: record filtered out (Config.Keep)", append(f.recordAttrs(rec, 0, nil, 0), slog.String("outcome", string(hook.OutcomeFiltered)))...)
		}
		return true
	case errors.Is(err, ErrExpired):
		f.calls.expiredLog.Log(ctx, f.log, slog.LevelInfo, "kscope: record expired (older than Config.MaxAge); skipped", "expired records",
			append(f.recordAttrs(rec, 0, err, 0), slog.String("outcome", string(hook.OutcomeExpired)))...)
		return true
	}
	return false
}

// call runs one handler call for r under the stall watch, the panic guard
// and, with Config.HandlerTimeout, a deadline and the overrun watch.
func (f *failures) call(ctx context.Context, r *Record, call func(ctx context.Context) error) error {
	handling(r)
	defer handled(r)
	d := f.calls.timeout
	if d <= 0 {
		return guard.Call(func() error { return call(ctx) })
	}
	tctx, cancel := handlerchain.WithDeadline(ctx, d)
	defer cancel()
	reported := make(chan struct{})
	over := time.AfterFunc(d+f.calls.grace, func() {
		defer close(reported)
		f.overrun(ctx, r)
	})
	err := guard.Call(func() error { return call(tctx) })
	if !over.Stop() {
		<-reported // it fired: let its report end before the record moves on
	}
	return handlerchain.Timed(tctx, err, d)
}

// overrun reports r's handler call, still running past its deadline and
// the grace: it ignores its context.
func (f *failures) overrun(ctx context.Context, r *Record) {
	f.obs.overran()
	f.obs.Event(r, hook.EventHandlerOverrun, (f.calls.timeout + f.calls.grace).String())
	f.log.LogAttrs(context.WithoutCancel(ctx), slog.LevelWarn, "kscope: a handler call runs on past HandlerTimeout and HandlerGrace: it ignores its context and holds its key-shard",
		append(f.recordAttrs(r, 0, nil, 0)[:5], slog.Duration("handler_timeout", f.calls.timeout), slog.Duration("handler_grace", f.calls.grace))...)
}

// open reports whether r's delivery has not been ended yet (without
// record hooks, deliveries are not tracked: every End is the first).
func (o *observer) open(r *Record) bool {
	return o != nil && (len(o.record) == 0 || r.obs == nil || !r.obs.ended)
}

// admitted counts a delivery that an admission rule ended, and returns
// its outcome, filtered or expired for a skip, dead_lettered for an
// expired record sent to the dead-letter topic, and its error (the rule's,
// when the scope ended it without one).
func (o *observer) admitted(r *Record, out hook.Outcome, err error) (hook.Outcome, error) {
	switch r.turned {
	case turnedFiltered:
		o.filtered.Add(1)
		return hook.OutcomeFiltered, cmpErr(err, errFiltered)
	case turnedExpired:
		o.expired.Add(1)
		if out == hook.OutcomeSkipped {
			out = hook.OutcomeExpired
		}
		return out, cmpErr(err, errExpired)
	}
	return out, err
}

// errExpired stands for an expired record's error in its delivery's end
// when the scope ended it without one.
var errExpired = retrytopic.Skip(ErrExpired)

// cmpErr returns err, or def when err is nil.
func cmpErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

// overran counts a handler call reported running past its deadline and
// grace.
func (o *observer) overran() { o.overruns.Add(1) }

// admissionStats fills in st's counters of the handler call.
func (o *observer) admissionStats(st *Stats) {
	st.Filtered, st.Expired, st.HandlerOverruns = o.filtered.Load(), o.expired.Load(), o.overruns.Load()
}
