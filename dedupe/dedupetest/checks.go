package dedupetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/dedupe"
)

func checkUnknown(t *testing.T, ctx context.Context, s dedupe.Store) {
	expectSeen(t, ctx, s, []string{"a", "b", "c"}, []bool{false, false, false})
}

func checkRemembered(t *testing.T, ctx context.Context, s dedupe.Store) {
	remember(t, ctx, s, longTTL, "a", "b")
	expectSeen(t, ctx, s, []string{"a", "b", "c"}, []bool{true, true, false})
	remember(t, ctx, s, longTTL, "c")
	expectSeen(t, ctx, s, []string{"c", "b", "a"}, []bool{true, true, true})
}

func checkOrder(t *testing.T, ctx context.Context, s dedupe.Store) {
	remember(t, ctx, s, longTTL, "b", "d", "d") // a duplicate in one call too
	expectSeen(t, ctx, s, []string{"a", "b", "c", "d", "b", "a", "d"}, []bool{false, true, false, true, true, false, true})

	// A thousand ids, every third remembered, asked in a random order.
	all := ids("many", 1000)
	var some []string
	for i := 0; i < len(all); i += 3 {
		some = append(some, all[i])
	}
	remember(t, ctx, s, longTTL, some...)
	order := rand.Perm(len(all))
	ask := make([]string, len(all))
	for i, j := range order {
		ask[i] = all[j]
	}
	got := seen(t, ctx, s, ask...)
	for i, j := range order {
		if want := j%3 == 0; got[i] != want {
			t.Fatalf("Seen of a thousand ids: entry %d (%q) is %v, want %v", i, ask[i], got[i], want)
		}
	}
}

func checkForget(t *testing.T, ctx context.Context, s dedupe.Store) {
	remember(t, ctx, s, longTTL, "a", "b", "c")
	forget(t, ctx, s, "a", "c", "never-remembered")
	expectSeen(t, ctx, s, []string{"a", "b", "c"}, []bool{false, true, false})
	forget(t, ctx, s, "a") // forgotten already
	remember(t, ctx, s, longTTL, "a")
	expectSeen(t, ctx, s, []string{"a", "b", "c"}, []bool{true, true, false})
}

// checkExpiry: an id is seen for its whole window and forgotten once it
// passed. The first Seen may come late on a loaded machine: it is wrong
// only when the window has not passed yet.
func checkExpiry(t *testing.T, ctx context.Context, s dedupe.Store) {
	remember(t, ctx, s, longTTL, "long")
	before := time.Now()
	remember(t, ctx, s, ShortTTL, "short")
	if got := seen(t, ctx, s, "short")[0]; !got {
		if e := time.Since(before); e < ShortTTL {
			t.Fatalf("%q was not seen %s after it was remembered for %s", "short", e, ShortTTL)
		}
	}
	gone := waitForgotten(t, ctx, s, "short")
	// The store's clock may tick differently from this process's by a few
	// milliseconds (rounding, another clock source).
	if e := gone.Sub(before); e < ShortTTL-10*time.Millisecond {
		t.Fatalf("%q was forgotten %s after it was remembered for %s", "short", e, ShortTTL)
	}
	expectSeen(t, ctx, s, []string{"long", "short"}, []bool{true, false})
	remember(t, ctx, s, longTTL, "short")
	expectSeen(t, ctx, s, []string{"short"}, []bool{true})
}

// checkExtend: "a" is remembered for ShortTTL, then again for longer;
// "sentinel", remembered for ShortTTL after both, is forgotten after a's
// first window passed, and a must still be seen.
func checkExtend(t *testing.T, ctx context.Context, s dedupe.Store) {
	remember(t, ctx, s, ShortTTL, "a")
	remember(t, ctx, s, longTTL, "a")
	remember(t, ctx, s, ShortTTL, "sentinel")
	waitForgotten(t, ctx, s, "sentinel")
	expectSeen(t, ctx, s, []string{"a"}, []bool{true})
}

// checkConcurrent: 16 goroutines each remember their own ids and a shared
// one, see them, and forget their own, 50 rounds each.
func checkConcurrent(t *testing.T, ctx context.Context, s dedupe.Store) {
	const workers, rounds = 16, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				own := fmt.Sprintf("w%d-r%d", w, r)
				shared := fmt.Sprintf("shared-%d", r%5)
				if err := s.Remember(ctx, []string{own, shared}, longTTL); err != nil {
					t.Errorf("worker %d: Remember: %v", w, err)
					return
				}
				got, err := s.Seen(ctx, []string{own, shared, fmt.Sprintf("w%d-r%d", w, r+1)})
				if err != nil || len(got) != 3 || !got[0] || !got[1] || got[2] {
					t.Errorf("worker %d, round %d: Seen(own, shared, next) = %v, %v; want [true true false]", w, r, got, err)
					return
				}
				if err := s.Forget(ctx, []string{own}); err != nil {
					t.Errorf("worker %d: Forget: %v", w, err)
					return
				}
				if got, err := s.Seen(ctx, []string{own}); err != nil || len(got) != 1 || got[0] {
					t.Errorf("worker %d, round %d: Seen(own) after Forget = %v, %v; want [false]", w, r, got, err)
					return
				}
			}
		})
	}
	wg.Wait()
	expectSeen(t, ctx, s, []string{"shared-0", "shared-4", "w0-r0"}, []bool{true, true, false})
}

func checkEmpty(t *testing.T, ctx context.Context, s dedupe.Store) {
	for _, empty := range [][]string{nil, {}} {
		got, err := s.Seen(ctx, empty)
		if err != nil || len(got) != 0 {
			t.Fatalf("Seen(%#v) = %v, %v; want an empty result and no error", empty, got, err)
		}
		if err := s.Remember(ctx, empty, longTTL); err != nil {
			t.Fatalf("Remember(%#v): %v", empty, err)
		}
		if err := s.Forget(ctx, empty); err != nil {
			t.Fatalf("Forget(%#v): %v", empty, err)
		}
	}
}

// checkAnyID: identities as the runner derives them, each remembered alone
// and asked with neighbours that must stay unseen.
func checkAnyID(t *testing.T, ctx context.Context, s dedupe.Store) {
	for _, c := range []struct{ id, neighbour string }{
		{"orders/3/1042", "orders/3/104"},
		{"with space", "with  space"},
		{"ünïcødé ✓ 注文", "unicode"},
		{"key:with:colons", "key:with"},
		{"*?[glob]", "*"},
		{"with\x00nul", "with\x00nus"},
		{"sha256:" + strings.Repeat("ab", 32), "sha256:" + strings.Repeat("ab", 31)},
		{strings.Repeat("y", 200), strings.Repeat("y", 199)},
		{"Case", "case"},
		{"trailing ", "trailing"},
		{"\t\n\r", "\t\n"},
	} {
		remember(t, ctx, s, longTTL, c.id)
		expectSeen(t, ctx, s, []string{c.id, c.neighbour}, []bool{true, false})
	}
}

// checkCleanup runs on a dedupe.Cleaner only: "old" and "sentinel" are
// remembered for ShortTTL, "kept" for longer; once the sentinel's window
// passed, Cleanup removes at least "old" (never looked at since) and
// "kept" stays seen; a second Cleanup finds nothing.
func checkCleanup(t *testing.T, ctx context.Context, s dedupe.Store) {
	c, ok := s.(dedupe.Cleaner)
	if !ok {
		t.Skipf("%T is not a dedupe.Cleaner (it expires identities itself)", s)
	}
	remember(t, ctx, s, ShortTTL, "old")
	remember(t, ctx, s, longTTL, "kept")
	remember(t, ctx, s, ShortTTL, "sentinel")
	waitForgotten(t, ctx, s, "sentinel")
	n, err := c.Cleanup(ctx)
	if err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if n < 1 || n > 2 {
		t.Fatalf("Cleanup removed %d identities, want 1 or 2 (old, and sentinel unless Seen freed it)", n)
	}
	expectSeen(t, ctx, s, []string{"kept", "old", "sentinel"}, []bool{true, false, false})
	if n, err := c.Cleanup(ctx); err != nil || n != 0 {
		t.Fatalf("a second Cleanup = %d, %v; want 0, nil", n, err)
	}
	remember(t, ctx, s, longTTL, "old")
	expectSeen(t, ctx, s, []string{"old"}, []bool{true})
}
