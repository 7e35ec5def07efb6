package kscopetest_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/kscopetest"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// acceptPipeline is a Kafka-scope pipeline that emits one record per
// order to orders.accepted, with opts.
func acceptPipeline(opts txn.Options) kscopetest.KafkaPipeline {
	return kscopetest.KafkaPipeline{
		Handler: txn.HandlerFunc(func(_ context.Context, r *consumer.Record, out txn.Emitter) error {
			id, err := orderID(r)
			if err != nil {
				return err
			}
			out.Emit(&kgo.Record{Topic: "orders.accepted", Key: r.Key, Value: []byte(id)})
			return nil
		}),
		OutputTopics:    []string{"orders.accepted"},
		OutputsPerInput: 1,
		Valid:           validOrder,
		Undecodable:     notAnOrder,
		Options:         opts,
	}
}

// kafkaNotApplied is notApplied without the broker fault on EndTxn, which
// only the in-process broker can inject (with KSCOPE_KAFKA=apache it is
// not applicable).
func kafkaNotApplied(t *testing.T, rep kscopetest.Report) []string {
	t.Helper()
	return slices.DeleteFunc(notApplied(t, rep), func(sc string) bool { return sc == "broker_fault_on_end_txn" })
}

// With the idempotency guard (txn.Options.Dedupe) the Kafka scope holds
// every row but the per-key versions: an upstream duplicate, also one
// that comes after a restart, and a replay produce no output and reach no
// handler.
func TestKitKafkaScopeWithTheGuard(t *testing.T) {
	rep := kscopetest.Kafka(t, acceptPipeline(txn.Options{Dedupe: &txn.DedupeOptions{}}))
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
	if got := kafkaNotApplied(t, rep); !slices.Equal(got, []string{"out_of_order_versions"}) {
		t.Fatalf("scenarios not applied: %v; want only the per-key versions", got)
	}
	for _, sc := range []string{"duplicate_delivery_skipped", "replay_no_new_effects"} {
		if !slices.ContainsFunc(rep, func(r kscopetest.Result) bool { return r.Scenario == sc && r.Held }) {
			t.Errorf("%s did not run and hold: %+v", sc, rep)
		}
	}
}

// With per-key versions (txn.Options.Versions) every row holds: versions
// out of order wait for the one before them, and a duplicate or a
// replayed record, which carries its original's version, is stale.
func TestKitKafkaScopeWithVersions(t *testing.T) {
	rep := kscopetest.Kafka(t, acceptPipeline(txn.Options{Versions: &sequence.Config{Gaps: sequence.Wait}}))
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
	if got := kafkaNotApplied(t, rep); len(got) > 0 {
		t.Fatalf("scenarios not applied: %v; want every row run", got)
	}
	if len(rep) != 11 {
		t.Fatalf("%d rows reported, want 11: %+v", len(rep), rep)
	}
}

// Without the guard and versions, the duplicate, replay and out-of-order
// rows are reported as not applicable, each saying why and what to set;
// the rest hold.
func TestKitKafkaScopeWithoutTheGuard(t *testing.T) {
	rep := kscopetest.Kafka(t, acceptPipeline(txn.Options{}))
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
	want := []string{"duplicate_delivery_skipped", "out_of_order_versions", "replay_no_new_effects"}
	if got := kafkaNotApplied(t, rep); !slices.Equal(got, want) {
		t.Fatalf("scenarios not applied: %v; want %v", got, want)
	}
	for _, r := range rep {
		why := "set KafkaPipeline.Options.Dedupe"
		if r.Scenario == "out_of_order_versions" {
			why = "has no Versions"
		}
		if slices.Contains(want, r.Scenario) && !strings.Contains(r.Detail, why) {
			t.Errorf("%s does not say %q: %q", r.Scenario, why, r.Detail)
		}
	}
}

// The out-of-order row follows the pipeline's gap policy (dead-lettered
// ahead of its gap, or accepted with the gap and the late version stale),
// and a guard that forgets at once (a window of a nanosecond) fails the
// duplicate and replay rows, saying what was produced again.
func TestKitKafkaScopeRowsFollowTheOptions(t *testing.T) {
	switch os.Getenv(leaveEnv) {
	case "kafka-deadletter":
		kscopetest.Kafka(t, acceptPipeline(txn.Options{Versions: &sequence.Config{Gaps: sequence.DeadLetter}}))
		return
	case "kafka-accept":
		kscopetest.Kafka(t, acceptPipeline(txn.Options{Versions: &sequence.Config{Gaps: sequence.Accept}}))
		return
	case "kafka-forgets":
		kscopetest.Kafka(t, acceptPipeline(txn.Options{Dedupe: &txn.DedupeOptions{Window: time.Nanosecond}}))
		return
	case "":
	default:
		return
	}
	for _, c := range []struct {
		mode, rows string
		fails      bool
		want       []string
	}{
		{"kafka-deadletter", "out_of_order_versions", false, []string{`--- PASS: \S+/out_of_order_versions\b`}},
		{"kafka-accept", "out_of_order_versions", false, []string{`--- PASS: \S+/out_of_order_versions\b`}},
		{"kafka-forgets", "duplicate_delivery_skipped|replay_no_new_effects", true, []string{
			`(?s)3 outputs and 0 DLT records, want 2 and 0.*--- FAIL: \S+/duplicate_delivery_skipped\b`,
			`(?s)the replay: 20 outputs and 0 DLT records, want 10 and 0.*--- FAIL: \S+/replay_no_new_effects\b`,
		}},
	} {
		t.Run(c.mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.count=1", "-test.v", "-test.run=^TestKitKafkaScopeRowsFollowTheOptions$/^("+c.rows+")$")
			cmd.Env = append(os.Environ(), leaveEnv+"="+c.mode)
			out, err := cmd.CombinedOutput()
			if (err != nil) != c.fails {
				t.Fatalf("child: %v, want it to fail: %v\n%s", err, c.fails, out)
			}
			for _, want := range c.want {
				if !regexp.MustCompile(want).Match(out) {
					t.Errorf("child output does not match %q:\n%s", want, out)
				}
			}
		})
	}
}
