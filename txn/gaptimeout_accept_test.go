package txn_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Wait, then accept (sequence.TimeoutAccept) in the Kafka scope: records
// parked behind a gap that does not fill within GapTimeout are applied
// over it, lowest version first, instead of dead-lettered; the versions
// skipped are counted, and one that arrives later is stale.
func TestVersionGapWaitThenAcceptKafka(t *testing.T) {
	k := setup(t)
	cfg := config(k, "gap-accept")
	r, err := txn.New(cfg, txn.Options{TransactionalID: "gap-accept", Versions: &sequence.Config{GapTimeout: 300 * time.Millisecond, OnTimeout: sequence.TimeoutAccept}}, versioned(t))
	if err != nil {
		t.Fatal(err)
	}
	runFor(t, r)
	for _, v := range []string{"1", "5", "4", "7"} {
		produceVersion(t, k, "acct", v)
	}
	testenv.WaitFor(t, 20*time.Second, "4 and 5 applied over the gap, then 7 over its own", func() bool { return r.Stats().Kafka.Outputs == 4 })
	if s := r.Stats().Kafka; s.GapsAccepted != 2 || s.VersionsSkipped != 3 || s.GapsTimedOut != 0 || s.DeadLettered != 0 {
		t.Fatalf("%+v; want two gaps accepted (before 4, before 7) over 3 versions, nothing dead-lettered", s)
	}
	produceVersion(t, k, "acct", "2")
	produceVersion(t, k, "acct", "8")
	testenv.WaitFor(t, 20*time.Second, "8 applied, 2 stale", func() bool { return r.Stats().Kafka.Outputs == 5 && r.Stats().Kafka.Stale == 1 })
	var got []string
	for _, o := range k.ReadAll(t, "out") {
		got = append(got, string(o.Value))
	}
	if want := "[acct:1 acct:4 acct:5 acct:7 acct:8]"; fmt.Sprint(got) != want {
		t.Fatalf("outputs %v; want %s", got, want)
	}
	if n := len(k.ReadAll(t, retrytopic.DLTopic("gap-accept"))); n != 0 {
		t.Fatalf("the DLT holds %d records; want none", n)
	}
}

// Options.FillGap in the Kafka scope: an input past a gap has its key's
// missing state rebuilt first; what the fill emits joins the transaction
// with the handler's outputs, and a fill that fails drops both (the input
// is retried, then filled).
func TestVersionGapFilledKafka(t *testing.T) {
	k := setup(t)
	cfg := config(k, "gap-fill")
	var fails atomic.Int32
	fails.Store(1)
	fill := func(_ context.Context, r *consumer.Record, gap sequence.Result, out txn.Emitter) error {
		for v := gap.Expected(); v < gap.Version; v++ {
			out.Emit(&kgo.Record{Topic: "out", Key: r.Key, Value: fmt.Appendf(nil, "%s:%d (filled)", r.Key, v)})
		}
		if fails.Add(-1) >= 0 {
			return errors.New("source of truth: 503") // after its outputs: they are dropped
		}
		return nil
	}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "gap-fill", Versions: &sequence.Config{}, FillGap: fill}, versioned(t))
	if err != nil {
		t.Fatal(err)
	}
	runFor(t, r)
	for _, v := range []string{"1", "4", "5"} {
		produceVersion(t, k, "acct", v)
	}
	testenv.WaitFor(t, 20*time.Second, "2 and 3 filled, then 4 and 5", func() bool { return r.Stats().Kafka.Records == 3 })
	if s := r.Stats().Kafka; s.GapsFilled != 1 || s.GapsDetected != 0 || s.DeadLettered != 0 {
		t.Fatalf("%+v; want one gap filled, nothing parked or dead-lettered", s)
	}
	var got []string
	for _, o := range k.ReadAll(t, "out") {
		got = append(got, string(o.Value))
	}
	if want := "[acct:1 acct:2 (filled) acct:3 (filled) acct:4 acct:5]"; fmt.Sprint(got) != want {
		t.Fatalf("outputs %v; want %s", got, want)
	}
}
