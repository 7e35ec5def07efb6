package dedupe_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/dedupe/dedupetest"
)

func TestMemoryConformance(t *testing.T) {
	dedupetest.Run(t, func(*testing.T) dedupe.Store { return dedupe.NewMemory(0) })
}

// The bound: past its maximum, Memory forgets the identities remembered
// longest ago; one remembered again counts as remembered last.
func TestMemoryForgetsTheOldestPastItsMaximum(t *testing.T) {
	ctx := context.Background()
	m := dedupe.NewMemory(3)
	for _, id := range []string{"a", "b", "c"} {
		if err := m.Remember(ctx, []string{id}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Remember(ctx, []string{"a"}, time.Hour); err != nil { // a is now the newest
		t.Fatal(err)
	}
	if err := m.Remember(ctx, []string{"d"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	got, _ := m.Seen(ctx, []string{"a", "b", "c", "d"})
	if want := []bool{true, false, true, true}; !slices.Equal(got, want) {
		t.Fatalf("Seen(a, b, c, d) = %v, want %v", got, want)
	}
	if m.Len() != 3 {
		t.Fatalf("Len = %d, want 3", m.Len())
	}
}

// Cleanup frees the expired entries: Len drops to the live ones.
func TestMemoryCleanupFreesExpiredEntries(t *testing.T) {
	ctx := context.Background()
	m := dedupe.NewMemory(0)
	if err := m.Remember(ctx, []string{"a", "b", "c"}, time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	if err := m.Remember(ctx, []string{"kept"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	var c dedupe.Cleaner = m
	deadline := time.Now().Add(10 * time.Second)
	var total int64
	for total < 3 && time.Now().Before(deadline) {
		n, err := c.Cleanup(ctx)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if total != 3 || m.Len() != 1 {
		t.Fatalf("Cleanup removed %d entries and %d are left, want 3 removed and 1 left", total, m.Len())
	}
}
