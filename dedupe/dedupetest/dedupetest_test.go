package dedupetest_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/dedupe/dedupetest"
)

// broken is a Memory store with one fault.
type broken struct {
	*dedupe.Memory
	fault string
}

func (b broken) key(ids []string) []string {
	if b.fault != "cuts-at-nul" {
		return ids
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i], _, _ = strings.Cut(id, "\x00")
	}
	return out
}

func (b broken) Seen(ctx context.Context, ids []string) ([]bool, error) {
	got, err := b.Memory.Seen(ctx, b.key(ids))
	if b.fault == "reversed" {
		slices.Reverse(got)
	}
	return got, err
}

func (b broken) Remember(ctx context.Context, ids []string, ttl time.Duration) error {
	switch b.fault {
	case "never-expires":
		ttl = time.Hour
	case "no-extend":
		seen, _ := b.Memory.Seen(ctx, ids)
		ids = slices.Clone(ids)
		for i := len(ids) - 1; i >= 0; i-- {
			if seen[i] {
				ids = slices.Delete(ids, i, i+1)
			}
		}
	}
	return b.Memory.Remember(ctx, b.key(ids), ttl)
}

func (b broken) Forget(ctx context.Context, ids []string) error {
	if b.fault == "no-forget" {
		return nil
	}
	return b.Memory.Forget(ctx, b.key(ids))
}

// TestBrokenStore runs the suite on a broken store, for
// TestRunFailsBrokenStores (in a process of its own: the suite's failures
// must not fail this run).
func TestBrokenStore(t *testing.T) {
	fault := os.Getenv("KSCOPE_DEDUPETEST_FAULT")
	if fault == "" {
		t.Skip("run by TestRunFailsBrokenStores")
	}
	dedupetest.Run(t, func(*testing.T) dedupe.Store { return broken{dedupe.NewMemory(0), fault} })
}

// The suite fails a store that breaks one rule, in the check of that rule,
// and passes the same store without the fault.
func TestRunFailsBrokenStores(t *testing.T) {
	for fault, check := range map[string]string{
		"":              "",
		"never-expires": "an_id_is_forgotten_when_its_window_passes",
		"reversed":      "the_result_follows_the_ids",
		"no-extend":     "remembering_again_extends_the_window",
		"no-forget":     "forget",
		"cuts-at-nul":   "any_identity",
	} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenStore$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "KSCOPE_DEDUPETEST_FAULT="+fault)
			if fault == "" {
				cmd.Env = append(cmd.Env, "KSCOPE_DEDUPETEST_FAULT=none")
			}
			out, err := cmd.CombinedOutput()
			failed := "--- FAIL: TestBrokenStore/" + check + " "
			switch {
			case check == "" && err != nil:
				t.Fatalf("the suite failed a store without a fault: %v\n%s", err, out)
			case check != "" && (err == nil || !strings.Contains(string(out), failed)):
				t.Fatalf("with the fault %q the suite should fail its check %q; it said (%v):\n%s", fault, check, err, out)
			}
		})
	}
}
