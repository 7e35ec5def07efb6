package consumer

import (
	"context"
	"log/slog"
	"time"

	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/scope"
)

// The backoff of a failed round (a transaction that did not commit, a
// statement that timed out): it grows while rounds fail in a row.
const (
	roundBase = 100 * time.Millisecond
	roundCap  = 30 * time.Second
)

// Rounds is kscope's one retry loop; every scope's in-place retries run on
// it (Attempts for a record at a time, the DB scope for a batch in a
// transaction). It calls round until a round says there is no more, and
// between two rounds hands over the done reports kept so far (done(nil),
// when done is not nil: what is durable may commit meanwhile) and waits:
// the round's Wait (a retry in place's delay, which the failure policy
// chose), or, after a failed round, a backoff that grows while rounds fail
// in a row. The wait holds the caller's key-shard and nothing else; while
// its rounds fail with Held, the key-shard counts in the runner's hold
// (Stats.Hold, hook.HoldHook). It
// reports false when work was left undone: ctx ended, the partition of the
// record the next round starts with (Round.Of) was revoked, or a round
// said Stop.
func (f *failures) Rounds(ctx context.Context, done func(*Record), round func() scope.Round[*Record]) bool {
	failed := 0      // rounds failed in a row
	holding := false // the last round failed with Held: this key-shard counts in the hold
	defer func() {
		if holding {
			f.hold.leave(f, false)
		}
	}()
	for {
		r := round()
		if held := r.Err != nil && r.Held; held != holding {
			if held {
				f.hold.enter(f, r.Err)
			} else {
				f.hold.leave(f, true)
			}
			holding = held
		}
		if r.Stop {
			return false
		}
		wait := r.Wait
		if r.Err != nil {
			if r.Progress {
				failed = 0
			}
			failed++
			d := backoff.Delay(failed, roundBase, roundCap)
			wait = max(wait, d)
			attrs := []slog.Attr{slog.Any("err", r.Err), slog.Int("attempt", failed), slog.Duration("retry_in", d)}
			if r.Of != nil {
				attrs = append(attrs, slog.String("topic", r.Of.Topic), slog.Int("partition", int(r.Of.Partition)), slog.Int64("offset", r.Of.Offset),
					slog.String("id", f.identity.Of(r.Of)))
			}
			level := slog.LevelWarn
			if r.Held {
				level = slog.LevelDebug // the hold is logged once, when it begins and ends
			}
			f.log.LogAttrs(ctx, level, "kscope: the scope's work on a batch failed; retrying", attrs...)
		} else if failed > 0 {
			f.log.Info("kscope: the scope's work on a batch succeeded after failed attempts", "failed_attempts", failed)
			failed = 0
		}
		if !r.More {
			return true
		}
		if ctx.Err() != nil || (r.Of != nil && r.Of.Revoked()) {
			return false
		}
		if done != nil {
			done(nil)
		}
		if wait > 0 {
			var revoked <-chan struct{}
			if r.Of != nil {
				revoked = revokedCh(r.Of)
			}
			d := waitingBuf(r.Of)
			if d != nil {
				d.wait(true) // a wait the policy chose is not a stall
			}
			slept := backoff.SleepOr(ctx, wait, revoked)
			if d != nil {
				d.wait(false)
			}
			if !slept {
				return false // stopped, or revoked: the next owner handles it
			}
		}
	}
}

// Attempts runs one record's in-place retries on [failures.Rounds]: it
// calls call for rec until it succeeds or the failure policy decides
// something other than a retry in place (a skip, a retry topic, the
// dead-letter topic), which the caller carries out; see scope.Attempt for
// what it returns. Before each retry the policy logs and counts it. OK is
// false when rec was left undone: ctx ended, or rec's partition was
// revoked, before an attempt or during the wait.
func (f *failures) Attempts(ctx context.Context, rec *Record, topics bool, done func(*Record), call func() error) (a scope.Attempt) {
	if ctx.Err() != nil || rec.Revoked() {
		return a
	}
	return f.attemptsAfter(ctx, rec, topics, done, call, call())
}

// attemptsAfter is Attempts once the first attempt ran and returned first:
// the AtLeastOnce scope's direct path (deliverBatch) makes the first call
// itself.
func (f *failures) attemptsAfter(ctx context.Context, rec *Record, topics bool, done func(*Record), call func() error, first error) (a scope.Attempt) {
	// A record that succeeds at once (nearly all of them) costs no
	// closure.
	if a.N, a.Err = 1, first; a.Err == nil {
		a.OK = true
		return a
	}
	a.OK = f.Rounds(ctx, done, func() scope.Round[*Record] {
		if a.N > 1 {
			if a.Err = call(); a.Err == nil {
				return scope.Round[*Record]{}
			}
		}
		if ctx.Err() != nil || rec.Revoked() {
			return scope.Round[*Record]{Stop: true} // canceled mid-handler, or revoked: the next owner handles it
		}
		if a.First.IsZero() {
			a.First = time.Now()
		}
		a.Step = f.Decide(ctx, rec, a.Err, a.N, topics)
		if a.Step.Action == retrytopic.ActionHold && f.calls.keys.inMemory {
			a.Held = true
			f.calls.keys.hold(rec, a.Step.Delay)
		}
		if a.Step.Action != retrytopic.ActionRetry {
			return scope.Round[*Record]{}
		}
		f.Route(ctx, rec, a.Err, a.Step, a.N, a.First) //nolint:errcheck // a retry in place: logs and counts only
		a.N++
		return scope.Round[*Record]{More: true, Of: rec, Wait: a.Step.Delay}
	})
	return a
}
