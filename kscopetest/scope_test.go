package kscopetest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/kscopetest"
)

// memStore is a store of effects in memory, shared by a scenario's
// runners: the order ids applied, in order, repeats included.
type memStore struct {
	mu     sync.Mutex
	orders []string
}

// atLeastOncePipeline is a pipeline on the AtLeastOnce scope (consumer.New)
// with no inbox: it applies a record again when it is delivered again.
// With faults false its handler does not run through the kit's Faults.
func atLeastOncePipeline(faults bool) kscopetest.ScopePipeline[*memStore] {
	return kscopetest.ScopePipeline[*memStore]{
		Open: func(*testing.T) *memStore { return &memStore{} },
		Runner: func(s *memStore, cfg consumer.Config, f *kscopetest.Faults) (*consumer.Runner, error) {
			apply := func(r *consumer.Record) error {
				var order struct{ ID string }
				if err := json.Unmarshal(r.Value, &order); err != nil {
					return consumer.DecodeError(err)
				}
				s.mu.Lock()
				s.orders = append(s.orders, order.ID)
				s.mu.Unlock()
				return nil
			}
			return consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error {
				if !faults {
					return apply(r)
				}
				return f.Call(r, func() error { return apply(r) })
			}))
		},
		Valid:       func(i int) *kgo.Record { return &kgo.Record{Value: fmt.Appendf(nil, `{"ID":"o-%d"}`, i)} },
		Undecodable: func() *kgo.Record { return &kgo.Record{Value: []byte("not json")} },
		Effects: func(_ context.Context, s *memStore) (int, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return len(s.orders), nil
		},
	}
}

// Scope reports the guarantees a scope breaks and only those: a scope with
// no inbox fails the duplicate, crash and replay scenarios, naming the
// records applied again, and passes the rest; a handler that does not run
// through the kit's Faults fails, saying so.
func TestScopeReportsWhatBreaks(t *testing.T) {
	switch os.Getenv(leaveEnv) {
	case "scope":
		t.Run("atleastonce", func(t *testing.T) { kscopetest.Scope(t, atLeastOncePipeline(true)) })
		t.Run("nofaults", func(t *testing.T) { kscopetest.Scope(t, atLeastOncePipeline(false)) })
		return
	case "":
	default:
		return
	}
	child := func(run string) []byte {
		cmd := exec.Command(os.Args[0], "-test.count=1", "-test.v", "-test.run="+run)
		cmd.Env = append(os.Environ(), leaveEnv+"=scope")
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("child %s passed; want its broken scenarios to fail:\n%s", run, out)
		}
		return out
	}
	out := child("^TestScopeReportsWhatBreaks$/^atleastonce$")
	for _, sc := range []string{"duplicate_delivery_skipped", "crash_before_offset_commit", "replay_no_new_effects"} {
		if !regexp.MustCompile(`--- FAIL: TestScopeReportsWhatBreaks/atleastonce/` + sc + `\b`).Match(out) {
			t.Errorf("%s did not fail for a scope with no inbox:\n%s", sc, out)
		}
	}
	for _, sc := range []string{"success_then_commit", "retryable_failure_retried", "non_retryable_failure_to_dlt",
		"undecodable_record_to_dlt", "poison_bounded_then_dlt", "batch_partial_failure"} {
		if !regexp.MustCompile(`--- PASS: TestScopeReportsWhatBreaks/atleastonce/` + sc + `\b`).Match(out) {
			t.Errorf("%s did not pass for a scope that keeps its guarantee:\n%s", sc, out)
		}
	}
	if regexp.MustCompile(`TestScopeReportsWhatBreaks/atleastonce/out_of_order_versions`).Match(out) {
		t.Errorf("the DB scope's version scenario ran for a scope of the service's own:\n%s", out)
	}
	if !regexp.MustCompile(`(?s)after the replay: 20 effects, 10 handler calls during the replay`).Match(out) {
		t.Errorf("the replay's failure does not say what was applied again:\n%s", out)
	}
	out = child("^TestScopeReportsWhatBreaks$/^nofaults$/^success_then_commit$")
	if !regexp.MustCompile(`(?s)the kit counted no call of the handler: the scope's handler must run each record's work through Faults.Call.*--- FAIL: TestScopeReportsWhatBreaks/nofaults/success_then_commit`).Match(out) {
		t.Errorf("a handler that bypasses the kit's Faults was not reported:\n%s", out)
	}
}
