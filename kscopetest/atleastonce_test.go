package kscopetest_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/kscopetest"
)

// shipments is a fake of the service an AtLeastOnce handler calls: the
// orders shipped, in order, repeats included, across every scenario.
type shipments struct {
	mu     sync.Mutex
	orders []string
}

func (s *shipments) handler() consumer.Handler {
	return consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error {
		id, err := orderID(r)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.orders = append(s.orders, id)
		s.mu.Unlock()
		return nil
	})
}

func (s *shipments) count(context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.orders), nil
}

// shipPipeline is an AtLeastOnce pipeline whose handler ships orders,
// with the idempotency guard on store (none when nil).
func shipPipeline(store dedupe.Store) kscopetest.AtLeastOncePipeline {
	s := &shipments{}
	p := kscopetest.AtLeastOncePipeline{Handler: s.handler(), Valid: validOrder, Undecodable: notAnOrder, Effects: s.count}
	if store != nil {
		p.Config = func(c consumer.Config) consumer.Config {
			// The service's identity header: the kit writes its message
			// ids there.
			c.Identity.Header = "order-message-id"
			c.Dedupe = consumer.DedupeConfig{Store: store}
			return c
		}
	}
	return p
}

// notApplied returns the scenarios rep reports as not applicable, after
// checking that each says why and is neither held nor failed.
func notApplied(t *testing.T, rep kscopetest.Report) []string {
	t.Helper()
	var out []string
	for _, r := range rep {
		if len(r.Repeats) > 0 {
			t.Errorf("%s: records handled again: %v", r.Scenario, r.Repeats)
		}
		if !r.Skipped {
			continue
		}
		if r.Held || !strings.HasPrefix(r.Detail, "not applicable: ") {
			t.Errorf("not applied %s: held %v, detail %q; want not held, and why", r.Scenario, r.Held, r.Detail)
		}
		out = append(out, r.Scenario)
	}
	slices.Sort(out)
	return out
}

// With the idempotency guard (a memory store shared by every scenario),
// an AtLeastOnce pipeline holds every row but the per-key versions: a
// duplicate, the redelivery after a crash and a replay are not handled
// again. The effects are the pipeline's own count, across scenarios.
func TestKitAtLeastOnceWithTheGuard(t *testing.T) {
	rep := kscopetest.AtLeastOnce(t, shipPipeline(dedupe.NewMemory(0)))
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
	if got := notApplied(t, rep); !slices.Equal(got, []string{"out_of_order_versions"}) {
		t.Fatalf("scenarios not applied: %v; want only the per-key versions", got)
	}
	if len(rep) != 10 {
		t.Fatalf("%d rows reported, want the table's 10: %+v", len(rep), rep)
	}
	for _, r := range rep {
		if r.Scenario == "out_of_order_versions" && !strings.Contains(r.Detail, "checks no per-key versions") {
			t.Errorf("the version row does not say why it does not apply: %q", r.Detail)
		}
	}
}

// A batch handler (consumer.NewBatch) with the guard holds the same rows
// as a per-record one: each record of a batch is looked up before the
// call and remembered once it succeeded.
func TestKitAtLeastOnceBatchWithTheGuard(t *testing.T) {
	p := shipPipeline(dedupe.NewMemory(0))
	h := p.Handler
	p.Handler = nil
	p.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, recs []*consumer.Record) error {
		for i, r := range recs {
			if err := h.Handle(ctx, r); err != nil {
				return consumer.FailedAt(i, err)
			}
		}
		return nil
	})
	rep := kscopetest.AtLeastOnce(t, p)
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
	if got := notApplied(t, rep); !slices.Equal(got, []string{"out_of_order_versions"}) {
		t.Fatalf("scenarios not applied: %v; want only the per-key versions", got)
	}
}

// Without the guard, the rows that need a record handled once are not
// applicable, each saying to set consumer.Config.Dedupe, and the rest
// hold; the effects are the handler's calls that returned nil, as the kit
// counts them.
func TestKitAtLeastOnceWithoutTheGuard(t *testing.T) {
	p := shipPipeline(nil)
	p.Effects = nil
	rep := kscopetest.AtLeastOnce(t, p)
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
	want := []string{"crash_before_offset_commit", "duplicate_delivery_skipped", "out_of_order_versions", "replay_no_new_effects"}
	if got := notApplied(t, rep); !slices.Equal(got, want) {
		t.Fatalf("scenarios not applied: %v; want %v", got, want)
	}
	for _, r := range rep {
		if r.Skipped && r.Scenario != "out_of_order_versions" && !strings.Contains(r.Detail, "set Config.Dedupe.Store (dedupe.NewMemory") {
			t.Errorf("%s does not say to set consumer.Config.Dedupe: %q", r.Scenario, r.Detail)
		}
	}
}

// forgetful is a dedupe store that never remembers: a guard that is on
// and does not work.
type forgetful struct{}

func (forgetful) Seen(_ context.Context, ids []string) ([]bool, error) {
	return make([]bool, len(ids)), nil
}
func (forgetful) Remember(context.Context, []string, time.Duration) error { return nil }
func (forgetful) Forget(context.Context, []string) error                  { return nil }

// A guard that does not work fails the rows it should hold, naming the
// records handled again, instead of passing them or reporting them as not
// applicable.
func TestKitAtLeastOnceReportsABrokenGuard(t *testing.T) {
	switch os.Getenv(leaveEnv) {
	case "forgetful":
		kscopetest.AtLeastOnce(t, shipPipeline(forgetful{}))
		return
	case "":
	default:
		return
	}
	cmd := exec.Command(os.Args[0], "-test.count=1", "-test.v",
		"-test.run=^TestKitAtLeastOnceReportsABrokenGuard$/^(duplicate_delivery_skipped|replay_no_new_effects|success_then_commit)$")
	cmd.Env = append(os.Environ(), leaveEnv+"=forgetful")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the kit passed a guard that never remembers:\n%s", out)
	}
	for _, want := range []string{
		// Two of the three copies in one batch: the second is a duplicate
		// of the first within the batch, whatever the store says; in
		// batches of their own, each copy is handled.
		`(?s)(3 effects, 2 handler calls of the message delivered three times, for it and one other; the runner counted 1|4 effects, 3 handler calls of the message delivered three times, for it and one other; the runner counted 0) duplicates, want 2.*--- FAIL: TestKitAtLeastOnceReportsABrokenGuard/duplicate_delivery_skipped\b`,
		`(?s)after the replay: 20 effects, 10 handler calls during the replay; the runner counted 0 duplicates, want 10.*--- FAIL: TestKitAtLeastOnceReportsABrokenGuard/replay_no_new_effects\b`,
		`--- PASS: TestKitAtLeastOnceReportsABrokenGuard/success_then_commit\b`,
	} {
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("child output does not match %q:\n%s", want, out)
		}
	}
}
