package consumer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/partition"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/scope"
	"github.com/twmb/franz-go/pkg/kgo"
)

func roundsFailures() *failures {
	return &failures{log: slog.New(slog.NewTextHandler(io.Discard, nil)), obs: newObserver("g", nil), dltLog: newDLTLog()}
}

// attemptLog keeps the "attempt" of every record logged.
type attemptLog struct {
	slog.Handler
	attempts *[]int64
}

func (h attemptLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "attempt" {
			*h.attempts = append(*h.attempts, a.Value.Int64())
		}
		return true
	})
	return nil
}

// TestRoundsHandsOverDoneBetweenRounds: between two rounds the loop hands
// over the done reports kept so far, so that what is durable commits while
// the rest waits; after the last round it does not.
func TestRoundsHandsOverDoneBetweenRounds(t *testing.T) {
	f := roundsFailures()
	rounds, flushes := 0, 0
	ok := f.Rounds(context.Background(), func(r *Record) {
		if r != nil {
			t.Fatalf("done(%v): the loop only hands over (done(nil))", r)
		}
		flushes++
	}, func() scope.Round[*Record] {
		rounds++
		return scope.Round[*Record]{More: rounds < 3}
	})
	if !ok || rounds != 3 || flushes != 2 {
		t.Fatalf("ok=%v rounds=%d flushes=%d, want true 3 2", ok, rounds, flushes)
	}
}

// TestRoundsBacksOffFailedRounds: a failed round is retried after a backoff
// that grows while rounds fail in a row and starts over after progress;
// the round's own wait (a retry in place) is not shortened by it.
func TestRoundsBacksOffFailedRounds(t *testing.T) {
	f := roundsFailures()
	var attempts []int64
	f.log = slog.New(attemptLog{slog.NewTextHandler(io.Discard, nil), &attempts})
	boom := errors.New("connection reset")
	var gaps []time.Duration
	last := time.Now()
	script := []scope.Round[*Record]{
		{More: true, Err: boom},
		{More: true, Err: boom},
		{More: true, Err: boom},                 // the third in a row: at least 200ms
		{More: true, Err: boom, Progress: true}, // starts over
		{More: true, Wait: 350 * time.Millisecond},
		{},
	}
	i := 0
	ok := f.Rounds(context.Background(), nil, func() scope.Round[*Record] {
		now := time.Now()
		if i > 0 {
			gaps = append(gaps, now.Sub(last))
		}
		last = now
		i++
		return script[i-1]
	})
	if !ok || i != len(script) {
		t.Fatalf("ok=%v rounds=%d", ok, i)
	}
	if want := []int64{1, 2, 3, 1}; !slices.Equal(attempts, want) {
		t.Fatalf("logged attempts %v, want %v: the backoff grows while rounds fail in a row and starts over after progress", attempts, want)
	}
	if gaps[2] < 200*time.Millisecond || gaps[4] < 350*time.Millisecond {
		t.Fatalf("waits %v: want the third backoff at least 200ms and the round's own wait at least 350ms", gaps)
	}
}

// TestRoundsStopsAtRevocation: a revoke during the wait ends the loop at
// once (the next owner gets the record), and so does a round that says
// Stop; both report the work as not done.
func TestRoundsStopsAtRevocation(t *testing.T) {
	f := roundsFailures()
	a := partition.NewAssignment(context.Background(), commit.NewPartition("t", 0))
	rec := &Record{part: &partState{Assignment: a}}
	start := time.Now()
	ok := f.Rounds(context.Background(), nil, func() scope.Round[*Record] {
		go a.Revoke()
		return scope.Round[*Record]{More: true, Of: rec, Wait: time.Hour}
	})
	if ok || time.Since(start) > 10*time.Second {
		t.Fatalf("ok=%v after %v: a revoke must end the wait", ok, time.Since(start))
	}
	if f.Rounds(context.Background(), nil, func() scope.Round[*Record] { return scope.Round[*Record]{Stop: true} }) {
		t.Fatal("a round that stops must report the work undone")
	}
	ctx, cancel := context.WithCancel(context.Background())
	if f.Rounds(ctx, nil, func() scope.Round[*Record] {
		cancel()
		return scope.Round[*Record]{More: true, Wait: time.Hour}
	}) {
		t.Fatal("a canceled context must end the loop with the work undone")
	}
}

// TestRoundsReportsHeldKeyShards: while a loop's rounds fail with Held,
// its key-shard counts in the runner's hold; two loops holding begin one
// hold, and it ends when the last of them goes on (a round succeeds, or
// the loop ends).
func TestRoundsReportsHeldKeyShards(t *testing.T) {
	f := roundsFailures()
	missing := errors.New("relation \"t\" does not exist (SQLSTATE 42P01)")
	var seen []int
	inner := func() scope.Round[*Record] {
		seen = append(seen, f.hold.stats().Shards)
		return scope.Round[*Record]{More: true, Err: missing, Held: true, Wait: time.Millisecond}
	}
	i := 0
	f.Rounds(context.Background(), nil, func() scope.Round[*Record] {
		i++
		switch i {
		case 1, 2:
			return scope.Round[*Record]{More: true, Err: missing, Held: true, Wait: time.Millisecond}
		case 3:
			// A second key-shard's loop meets the error while this one holds,
			// and stops while it still fails.
			n := 0
			f.Rounds(context.Background(), nil, func() scope.Round[*Record] {
				if n++; n == 3 {
					return scope.Round[*Record]{Stop: true}
				}
				return inner()
			})
			return scope.Round[*Record]{More: true, Err: missing, Held: true}
		case 4:
			seen = append(seen, f.hold.stats().Shards)
			return scope.Round[*Record]{More: true} // the statement succeeds
		}
		seen = append(seen, f.hold.stats().Shards)
		return scope.Round[*Record]{}
	})
	// Rounds 1-2 hold (1); the inner loop's rounds see 1 then 2; after
	// it stopped, round 4 sees 1; round 5 sees 0.
	if want := []int{1, 2, 1, 0}; !slices.Equal(seen, want) {
		t.Fatalf("held key-shards seen %v, want %v", seen, want)
	}
	st := f.hold.stats()
	if st.Shards != 0 || st.Holds != 1 || st.Err != "" || !st.Since.IsZero() {
		t.Fatalf("hold after the loops %+v, want none held, one hold begun", st)
	}
}

// A scope may ask for a retry topic (Decide's topics) only when it told
// the runner it uses them (scope.RetryTopicUser): only then does the runner
// create and consume them. A scope of a service's own that asks without
// saying so gets the retries in place and the dead-letter topic instead,
// not records routed to topics nobody consumes.
func TestDecideSendsNoRecordToRetryTopicsTheRunnerDoesNotConsume(t *testing.T) {
	pol := retrytopic.Policy{Unordered: true}.WithDefaults("g")
	rec := &Record{Record: &kgo.Record{Topic: "t", Key: []byte("k")}}
	err := Retryable(errors.New("gateway down"))
	for _, uses := range []bool{true, false} {
		f := roundsFailures()
		f.policy, f.topics = pol, uses
		sawTopic := false
		for attempt := 1; attempt <= pol.RetryBudget(true); attempt++ {
			if f.Decide(context.Background(), rec, err, attempt, true).Action == retrytopic.ActionRetryTopic {
				sawTopic = true
			}
		}
		if sawTopic != uses {
			t.Errorf("runner consuming the retry topics %v: a retry topic decided %v, want %v", uses, sawTopic, uses)
		}
	}
}
