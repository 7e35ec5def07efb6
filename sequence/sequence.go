// Package sequence is kscope's version-gap detection: records carry a
// per-key version, and the consumer applies each key's versions in order,
// once.
//
// A version comes from a header ([DefaultHeader] unless configured) or an
// extractor. The last applied version per (consumer, key) is kept with the
// effects: in the DB scope (dbscope.Options.Versions) in PostgreSQL, read
// with a row lock, checked and advanced in the same transaction as the
// record's inbox row and its handler.
//
//	v <= last      stale or duplicate: skipped and counted
//	v == last+1    applied
//	v >  last+1    a gap, by GapPolicy: Wait (default) sends the record to
//	               the retry topics with its key parked, while records that
//	               fill the gap still pass, until the missing versions are
//	               applied or GapTimeout passes (then the DLT, with the
//	               expected and actual versions in headers, or, with
//	               OnTimeout TimeoutAccept, applied over the gap); DeadLetter sends
//	               it to the DLT at once; Accept applies it and counts the gap
//
// The first version seen for a key is accepted whatever it is, or required
// to be 1 (FirstPolicy). A record whose version cannot be read is poison: it
// goes to the DLT with the reason. The handler reads the check's result
// with [FromContext].
package sequence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/guard"
)

// DefaultHeader is the header a record's version is read from unless
// Config.Header or Config.Extract says otherwise: a decimal integer >= 1.
const DefaultHeader = "version"

// DefaultGapTimeout is how long a record waits for the versions before it.
const DefaultGapTimeout = 10 * time.Minute

// GapPolicy says what happens to a record whose version is ahead of the next
// one due.
type GapPolicy int

const (
	// Wait parks the key and retries the record through the retry topics
	// until the missing versions are applied or GapTimeout passes, however
	// many attempts the failure policy gives a failing handler.
	Wait GapPolicy = iota
	// DeadLetter sends the record to the dead-letter topic at once.
	DeadLetter
	// Accept applies the record and counts the gap; its version becomes
	// the key's last. It suits the first run after Versions was turned
	// off for a while: keys written meanwhile have stored versions behind
	// their records', and would otherwise all wait out GapTimeout.
	Accept
)

// TimeoutPolicy says what becomes of a record that waited GapTimeout for
// the versions before it (Gaps: Wait).
type TimeoutPolicy int

const (
	// TimeoutDeadLetter sends it to the dead-letter topic, with the
	// expected and actual versions in headers (default).
	TimeoutDeadLetter TimeoutPolicy = iota
	// TimeoutAccept applies it over the gap, as Accept would: wait, then
	// accept. Its version becomes the key's last; the versions it skipped
	// are counted (VersionsSkipped in the scope's stats) and never applied
	// (one that arrives later is stale). It suits a key whose missing
	// versions may never come (a producer that lost them) when a late
	// state is better than none.
	TimeoutAccept
)

// FirstPolicy says which version is accepted for a key never seen before.
type FirstPolicy int

const (
	// FirstAny accepts any version for a new key (default).
	FirstAny FirstPolicy = iota
	// FirstMustBeOne treats a first version other than 1 as a gap.
	FirstMustBeOne
)

// Config configures version checks.
type Config struct {
	// Header is the header the version is read from. Default DefaultHeader.
	Header string
	// Extract, when not nil, reads the version instead of Header. A
	// record for which it returns an error or a version below 1, or
	// panics, is poison (see Version).
	Extract func(*consumer.Record) (int64, error)
	// Gaps says what happens on a gap. Default Wait.
	Gaps GapPolicy
	// First says which first version of a key is accepted. Default FirstAny.
	First FirstPolicy
	// GapTimeout bounds how long a record waits for the versions before it
	// (Wait), counted from its first failure. Default DefaultGapTimeout.
	GapTimeout time.Duration
	// OnTimeout says what becomes of a record that waited GapTimeout
	// (Wait). Default TimeoutDeadLetter.
	OnTimeout TimeoutPolicy
}

// AcceptsLate reports whether a record past a gap, waiting since
// firstFailure, is now applied over it: Gaps is Wait, OnTimeout is
// TimeoutAccept, and GapTimeout has passed.
func (c Config) AcceptsLate(firstFailure time.Time) bool {
	return c.Gaps == Wait && c.OnTimeout == TimeoutAccept && !firstFailure.IsZero() && time.Since(firstFailure) > c.GapTimeout
}

// WithDefaults returns c with zero fields set.
func (c Config) WithDefaults() Config {
	if c.Header == "" {
		c.Header = DefaultHeader
	}
	if c.GapTimeout == 0 {
		c.GapTimeout = DefaultGapTimeout
	}
	return c
}

// Validate reports what is wrong with c.
func (c Config) Validate() error {
	var errs []error
	if c.Gaps < Wait || c.Gaps > Accept {
		errs = append(errs, fmt.Errorf("sequence: Gaps is %d; use sequence.Wait, DeadLetter or Accept", c.Gaps))
	}
	if c.First < FirstAny || c.First > FirstMustBeOne {
		errs = append(errs, fmt.Errorf("sequence: First is %d; use sequence.FirstAny or FirstMustBeOne", c.First))
	}
	if c.OnTimeout < TimeoutDeadLetter || c.OnTimeout > TimeoutAccept {
		errs = append(errs, fmt.Errorf("sequence: OnTimeout is %d; use sequence.TimeoutDeadLetter or TimeoutAccept", c.OnTimeout))
	} else if c.OnTimeout == TimeoutAccept && c.Gaps != Wait {
		errs = append(errs, errors.New("sequence: OnTimeout is TimeoutAccept with a Gaps policy other than Wait, which is the only one that waits; set Gaps to sequence.Wait, or leave OnTimeout unset"))
	}
	if c.GapTimeout < 0 {
		errs = append(errs, fmt.Errorf("sequence: GapTimeout is %s; set a positive duration (0 selects %s)", c.GapTimeout, DefaultGapTimeout))
	}
	return errors.Join(errs...)
}

// ErrNoVersion is wrapped by the error of a record without a readable
// version.
var ErrNoVersion = errors.New("no readable version")

// Version reads r's version. An error wraps ErrNoVersion: the header is
// missing or not an integer >= 1, or Extract returned an error, a version
// below 1, or panicked (the error's message has the panic's value; a
// runner logs its stack once per record).
func (c Config) Version(r *consumer.Record) (int64, error) {
	if c.Extract != nil {
		v, err := c.extract(r)
		if err != nil {
			return 0, fmt.Errorf("sequence: %w: %w", ErrNoVersion, err)
		}
		if v < 1 {
			return 0, fmt.Errorf("sequence: %w: extractor returned %d, versions start at 1", ErrNoVersion, v)
		}
		return v, nil
	}
	raw, ok := r.Header(c.Header)
	if !ok {
		return 0, fmt.Errorf("sequence: %w: header %q missing", ErrNoVersion, c.Header)
	}
	v, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || v < 1 {
		shown := raw
		if len(shown) > 32 {
			shown = shown[:32]
		}
		return 0, fmt.Errorf("sequence: %w: header %q is %q, want an integer >= 1", ErrNoVersion, c.Header, shown)
	}
	return v, nil
}

// extract runs Extract, a panic in it becoming an error: one record an
// extractor cannot read must not take the process down with every other
// key-shard's work (the record is redelivered after a restart, and would
// take it down again).
func (c Config) extract(r *consumer.Record) (v int64, err error) {
	defer func() {
		if p := recover(); p != nil {
			v, err = 0, guard.Recovered("the extractor panicked: ", p)
		}
	}()
	return c.Extract(r)
}

// Outcome is the result of a version check.
type Outcome int

const (
	// Applied: the record's version is the next one due (or the first one
	// accepted for its key).
	Applied Outcome = iota
	// Stale: the version is at or below the last applied one.
	Stale
	// Gap: the version is ahead of the next one due.
	Gap
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Stale:
		return "stale"
	case Gap:
		return "gap"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result is a version check's result.
type Result struct {
	Outcome Outcome
	Version int64 // the record's version
	Last    int64 // the last applied version before this record (0 for a new key)
	First   bool  // no version of the key was applied before
}

// Check decides a record's outcome from its version v and the last applied
// version of its key (known=false for a key never seen).
func (c Config) Check(v, last int64, known bool) Result {
	r := Result{Version: v, Last: last, First: !known}
	switch {
	case !known && (c.First == FirstAny || v == 1):
		r.Outcome = Applied
	case !known:
		r.Outcome = Gap
	case v <= last:
		r.Outcome = Stale
	case v == last+1:
		r.Outcome = Applied
	default:
		r.Outcome = Gap
	}
	return r
}

// Expected returns the version that was due when r was checked.
func (r Result) Expected() int64 { return r.Last + 1 }

type ctxKey struct{}

// WithResult returns ctx carrying r, for the handler.
func WithResult(ctx context.Context, r Result) context.Context {
	return context.WithValue(ctx, ctxKey{}, r)
}

// FromContext returns the version check's result for the record being
// handled, when versions are checked.
func FromContext(ctx context.Context) (Result, bool) {
	r, ok := ctx.Value(ctxKey{}).(Result)
	return r, ok
}
