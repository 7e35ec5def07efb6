// Package dedupetest is the conformance suite of dedupe.Store: [Run] checks
// a store, kscope's or one's own, against what the idempotency guard
// relies on. kscope runs it on dedupe.Memory, dedupe.Postgres and
// redisstore.Store; a service that writes a store of its own runs it from
// a test:
//
//	func TestMyStore(t *testing.T) {
//		dedupetest.Run(t, func(t *testing.T) dedupe.Store {
//			return mystore.New(...) // a fresh, empty store
//		})
//	}
//
// Run with -race: one check uses the store from many goroutines. The
// checks that wait for a window to pass take about a second; the subtests
// run in parallel.
package dedupetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/dedupe"
)

// ShortTTL is the window of the checks that wait for one to pass.
const ShortTTL = 300 * time.Millisecond

// longTTL is the window of identities that must stay seen during a check.
const longTTL = time.Hour

// waitLimit bounds each wait for a condition, deadline each check.
const (
	waitLimit = 5 * time.Second
	deadline  = 30 * time.Second
)

// Run runs the suite, one subtest per rule, each on a store newStore
// returns for it: a fresh one, empty (a table, key prefix or database of
// its own), closed through t.Cleanup. The rules:
//
//   - unknown identities are not seen;
//   - remembered identities are seen, other ones not;
//   - Seen's result has one entry per id, in the ids' order (duplicates
//     included), also for a thousand ids;
//   - Forget forgets (unknown ids are no error), and an id remembered
//     again is seen;
//   - an identity is seen until its window (ttl) passes, and not after
//     (waited for with a deadline, ShortTTL);
//   - remembering an identity again extends its window;
//   - concurrent calls from many goroutines see their own and each
//     other's identities;
//   - calls with no ids succeed (Seen returns an empty result);
//   - any identity the runner derives (consumer.Identity: UTF-8, up to
//     200 bytes, any character, NUL included) is one identity, distinct
//     from its neighbours;
//   - a store that is a dedupe.Cleaner removes expired identities, and
//     only those.
func Run(t *testing.T, newStore func(t *testing.T) dedupe.Store) {
	t.Helper()
	for _, c := range []struct {
		name string
		run  func(t *testing.T, ctx context.Context, s dedupe.Store)
	}{
		{"unknown ids are not seen", checkUnknown},
		{"remembered ids are seen", checkRemembered},
		{"the result follows the ids", checkOrder},
		{"forget", checkForget},
		{"an id is forgotten when its window passes", checkExpiry},
		{"remembering again extends the window", checkExtend},
		{"concurrent use", checkConcurrent},
		{"no ids", checkEmpty},
		{"any identity", checkAnyID},
		{"cleanup removes expired ids only", checkCleanup},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			c.run(t, ctx, s)
		})
	}
}

// seen calls s.Seen and fails the test on an error or a result of the
// wrong length.
func seen(t *testing.T, ctx context.Context, s dedupe.Store, ids ...string) []bool {
	t.Helper()
	got, err := s.Seen(ctx, ids)
	if err != nil {
		t.Fatalf("Seen(%q): %v", ids, err)
	}
	if len(got) != len(ids) {
		t.Fatalf("Seen(%q) returned %d results for %d ids: %v", ids, len(got), len(ids), got)
	}
	return got
}

// expectSeen fails the test unless Seen(ids) is want.
func expectSeen(t *testing.T, ctx context.Context, s dedupe.Store, ids []string, want []bool) {
	t.Helper()
	if got := seen(t, ctx, s, ids...); !slices.Equal(got, want) {
		t.Fatalf("Seen(%q) = %v, want %v", ids, got, want)
	}
}

func remember(t *testing.T, ctx context.Context, s dedupe.Store, ttl time.Duration, ids ...string) {
	t.Helper()
	if err := s.Remember(ctx, ids, ttl); err != nil {
		t.Fatalf("Remember(%q, %s): %v", ids, ttl, err)
	}
}

func forget(t *testing.T, ctx context.Context, s dedupe.Store, ids ...string) {
	t.Helper()
	if err := s.Forget(ctx, ids); err != nil {
		t.Fatalf("Forget(%q): %v", ids, err)
	}
}

// waitForgotten waits, at most waitLimit, for id not to be seen any more,
// and returns when it first was not.
func waitForgotten(t *testing.T, ctx context.Context, s dedupe.Store, id string) time.Time {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	limit := time.NewTimer(waitLimit)
	defer limit.Stop()
	for {
		if !seen(t, ctx, s, id)[0] {
			return time.Now()
		}
		select {
		case <-limit.C:
			t.Fatalf("%q is still seen %s after it was remembered for %s", id, waitLimit, ShortTTL)
		case <-tick.C:
		}
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}
