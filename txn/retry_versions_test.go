package txn_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// With an Unordered policy, a record that keeps failing goes to a delayed
// retry topic inside the transaction, is held there until its due time,
// and yields its outputs exactly once; a runner stopped while it is held
// does not lose it.
func TestRetryTopicsInsideTheTransaction(t *testing.T) {
	k := setup(t)
	cfg := config(k, "retry")
	cfg.Failures = retrytopic.Policy{
		Unordered: true, InPlaceAttempts: 1, RetryableAttempts: 4,
		Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond,
		Ladder: []time.Duration{time.Second},
	}
	var mu sync.Mutex
	attempts := map[string][]time.Time{}
	var dueSeen []time.Time
	h := txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
		v := string(r.Value)
		mu.Lock()
		attempts[v] = append(attempts[v], time.Now())
		n := len(attempts[v])
		if d, ok := r.Header(consumer.HeaderDue); ok {
			ms, _ := strconv.ParseInt(string(d), 10, 64)
			dueSeen = append(dueSeen, time.UnixMilli(ms))
		}
		mu.Unlock()
		if v == "flaky" && n <= 2 {
			return consumer.Retryable(errors.New("gateway 503"))
		}
		if v == "poison" {
			return consumer.DecodeError(errors.New("unparseable"))
		}
		return enrich.Handle(ctx, r, out)
	})
	inputs := []string{"a-1", "flaky", "a-2", "poison", "a-3"}
	for i, v := range inputs {
		if err := k.Produce(context.Background(), &kgo.Record{Topic: "in", Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}

	// First runner: routes "flaky" to the retry topic, then stops while it
	// is held there.
	r1, err := txn.New(cfg, txn.Options{TransactionalID: "retry-1"}, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r1)
	testenv.WaitFor(t, 20*time.Second, "flaky routed and held", func() bool {
		s := r1.Stats()
		return s.Kafka.RetryTopic == 1 && s.Kafka.Held >= 1 && s.Kafka.Records == 5
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if n := len(attempts["flaky"]); n != 1 {
		t.Fatalf("flaky handled %d times before its due time, want 1", n)
	}
	mu.Unlock()

	// Second runner: picks the held record up from its retry topic, not
	// before it is due; the second failure goes to the retry topic again.
	r2, err := txn.New(cfg, txn.Options{TransactionalID: "retry-2"}, h)
	if err != nil {
		t.Fatal(err)
	}
	runFor(t, r2)
	testenv.WaitFor(t, 30*time.Second, "flaky applied after two hops", func() bool {
		return r2.Stats().Kafka.Outputs >= 2 && r2.Stats().Kafka.RetryTopic == 1
	})
	mu.Lock()
	if n := len(attempts["flaky"]); n != 3 {
		t.Fatalf("flaky handled %d times, want 3 (first try and two hops)", n)
	}
	if len(dueSeen) != 2 {
		t.Fatalf("%d retry-topic deliveries seen, want 2", len(dueSeen))
	}
	for i, due := range dueSeen {
		if at := attempts["flaky"][i+1]; at.Add(time.Millisecond).Before(due) {
			t.Fatalf("hop %d handled at %s, before its due time %s", i+1, at.Format(time.StampMilli), due.Format(time.StampMilli))
		}
	}
	mu.Unlock()

	checkExactlyOnce(t, k, []string{"a-1", "flaky", "a-2", "a-3"})
	retries := k.ReadAll(t, retrytopic.RetryTopic("retry", time.Second))
	if len(retries) != 2 {
		t.Fatalf("%d records in the retry topic, want 2", len(retries))
	}
	if got := testenv.Header(retries[1], retrytopic.HeaderAttempt); got != "2" {
		t.Fatalf("second hop carries attempt %q, want 2", got)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic("retry"))
	if len(dlt) != 1 || string(dlt[0].Value) != "poison" {
		t.Fatalf("DLT holds %d records, want the poison one", len(dlt))
	}
	// Both retry records were consumed and committed past (the end offset
	// itself lies past the transaction markers).
	testenv.WaitFor(t, 10*time.Second, "retry topic offsets committed", func() bool {
		com, err := k.CommittedOffsets(context.Background(), "retry", retrytopic.RetryTopic("retry", time.Second))
		return err == nil && com[retries[1].Partition] > retries[1].Offset
	})
}

// versioned is a handler that emits "<key>:<version>" for every record it
// applies, and checks what sequence.FromContext says.
func versioned(t *testing.T) txn.Handler {
	return txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
		res, ok := sequence.FromContext(ctx)
		if !ok {
			t.Errorf("no version check result for %s", r.Value)
		}
		v, _ := r.Header("version")
		if res.Version != mustInt(string(v)) {
			t.Errorf("check result version %d, record version %s", res.Version, v)
		}
		out.Emit(&kgo.Record{Topic: "out", Key: r.Key, Value: []byte(string(r.Key) + ":" + string(v))})
		return nil
	})
}

func mustInt(s string) int64 {
	v, _ := strconv.ParseInt(s, 10, 64)
	return v
}

func produceVersion(t *testing.T, k *testenv.Kafka, key string, v string) {
	t.Helper()
	rec := &kgo.Record{Topic: "in", Key: []byte(key), Value: []byte(key + "@" + v)}
	if v != "" {
		rec.Headers = []kgo.RecordHeader{{Key: "version", Value: []byte(v)}}
	}
	if err := k.Produce(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
}

// Version gaps in the Kafka scope behave as in the DB scope, across
// restarts: the versions and the parked records are restored from the
// changelog by the next runner.
func TestVersionGapsAcrossRestarts(t *testing.T) {
	k := setup(t)
	cfg := config(k, "versions")
	start := func(id string, gapTimeout time.Duration) (*txn.Runner, func() error) {
		t.Helper()
		r, err := txn.New(cfg, txn.Options{TransactionalID: id, Versions: &sequence.Config{GapTimeout: gapTimeout}}, versioned(t))
		if err != nil {
			t.Fatal(err)
		}
		return r, runFor(t, r)
	}

	// Run 1: versions 1 and 2 of "acct" are applied.
	produceVersion(t, k, "acct", "1")
	produceVersion(t, k, "acct", "2")
	r1, stop := start("v-1", time.Hour)
	testenv.WaitFor(t, 20*time.Second, "run 1 applied two versions", func() bool { return r1.Stats().Kafka.Outputs == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// Run 2: a redelivered 2 is stale; 4 is ahead and parked; "late" gets
	// 1 and then 3, which is parked too; a record without a version is
	// poison. Another key flows meanwhile.
	produceVersion(t, k, "acct", "2")
	produceVersion(t, k, "acct", "4")
	produceVersion(t, k, "late", "1")
	produceVersion(t, k, "late", "3")
	produceVersion(t, k, "other", "1")
	produceVersion(t, k, "acct", "")
	r2, stop := start("v-2", time.Hour)
	testenv.WaitFor(t, 20*time.Second, "run 2 checked every record", func() bool { return r2.Stats().Kafka.Records == 6 })
	if s := r2.Stats(); s.Kafka.Stale != 1 || s.Kafka.GapsDetected != 2 || s.Kafka.DeadLettered != 1 || s.Kafka.Outputs != 2 {
		t.Fatalf("run 2: %+v; want 1 stale, 2 gaps, 1 dead-lettered, 2 outputs", s)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// Run 3: 3 fills acct's gap; the parked 4, restored from the
	// changelog, follows in the same transaction.
	produceVersion(t, k, "acct", "3")
	r3, stop := start("v-3", time.Hour)
	testenv.WaitFor(t, 20*time.Second, "run 3 healed acct", func() bool { return r3.Stats().Kafka.GapsHealed == 1 })
	if s := r3.Stats(); s.Kafka.Outputs != 2 || s.Kafka.GapsTimedOut != 0 {
		t.Fatalf("run 3: %+v; want 2 outputs and no timeout", s)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// Run 4, with a short gap timeout: late's 3, parked since run 2, goes
	// to the DLT with the expected and actual versions, and then late's 2
	// and a new 3 apply.
	r4, stop := start("v-4", 50*time.Millisecond)
	testenv.WaitFor(t, 20*time.Second, "run 4 timed late's gap out", func() bool { return r4.Stats().Kafka.GapsTimedOut == 1 })
	produceVersion(t, k, "late", "2")
	produceVersion(t, k, "late", "3")
	testenv.WaitFor(t, 20*time.Second, "run 4 applied late 2 and 3", func() bool { return r4.Stats().Kafka.Outputs == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	got := map[string][]string{}
	for _, r := range k.ReadAll(t, "out") {
		got[string(r.Key)] = append(got[string(r.Key)], string(r.Value))
	}
	want := map[string][]string{
		"acct":  {"acct:1", "acct:2", "acct:3", "acct:4"},
		"late":  {"late:1", "late:2", "late:3"},
		"other": {"other:1"},
	}
	for key, w := range want {
		if fmt.Sprint(got[key]) != fmt.Sprint(w) {
			t.Fatalf("outputs of %s: %v, want %v", key, got[key], w)
		}
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic("versions"))
	if len(dlt) != 2 {
		t.Fatalf("%d DLT records, want 2 (no version, late's timed-out 3)", len(dlt))
	}
	var timedOut *kgo.Record
	for _, r := range dlt {
		if string(r.Key) == "late" {
			timedOut = r
		}
	}
	if timedOut == nil || testenv.Header(timedOut, retrytopic.HeaderVersionExpected) != "2" || testenv.Header(timedOut, retrytopic.HeaderVersionActual) != "3" {
		t.Fatalf("timed-out gap record %v lacks expected=2 / actual=3 version headers", timedOut)
	}
}

// DeadLetter and Accept gap policies, and a first version that must be 1.
func TestVersionGapPolicies(t *testing.T) {
	k := setup(t)
	cases := []struct {
		name    string
		cfg     sequence.Config
		outputs int64
		dead    int64
	}{
		{"dead-letter", sequence.Config{Gaps: sequence.DeadLetter}, 2, 1}, // 1, 3 (DLT), 2
		{"accept", sequence.Config{Gaps: sequence.Accept}, 2, 0},          // 1, 3 (over the gap), 2 stale
		{"first-must-be-one", sequence.Config{Gaps: sequence.DeadLetter, First: sequence.FirstMustBeOne}, 0, 3},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			topic := fmt.Sprintf("in-%d", i)
			if err := k.CreateTopic(context.Background(), topic, 1); err != nil {
				t.Fatal(err)
			}
			first := "1"
			if c.cfg.First == sequence.FirstMustBeOne {
				first = "5"
			}
			for _, v := range []string{first, "3", "2"} {
				rec := &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(v), Headers: []kgo.RecordHeader{{Key: "version", Value: []byte(v)}}}
				if err := k.Produce(context.Background(), rec); err != nil {
					t.Fatal(err)
				}
			}
			cfg := config(k, "policy-"+c.name)
			cfg.Topics = []string{topic}
			vc := c.cfg
			r, err := txn.New(cfg, txn.Options{TransactionalID: "p-" + c.name, Versions: &vc}, versioned(t))
			if err != nil {
				t.Fatal(err)
			}
			runFor(t, r)
			testenv.WaitFor(t, 20*time.Second, "three records checked", func() bool { return r.Stats().Kafka.Records == 3 })
			if s := r.Stats(); s.Kafka.Outputs != c.outputs || s.Kafka.DeadLettered != c.dead {
				t.Fatalf("%+v; want %d outputs, %d dead-lettered", s, c.outputs, c.dead)
			}
		})
	}
}

// Versions and an Unordered policy do not combine: New says so.
func TestVersionsNeedOrder(t *testing.T) {
	k := setup(t)
	cfg := config(k, "bad")
	cfg.Failures.Unordered = true
	_, err := txn.New(cfg, txn.Options{Versions: &sequence.Config{}}, enrich)
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Versions" {
		t.Fatalf("New: %v; want a ConfigError on Versions", err)
	}
}

// Versions removed while a record waits in the changelog for a missing
// version: its input offset is committed, and only a runner with Versions
// applies it or dead-letters it. A runner without Versions refuses to
// start, naming the changelog, rather than leave it there unsaid; once no
// record waits (here: timed out to the DLT), it starts.
func TestVersionsRemovedWhileRecordsWait(t *testing.T) {
	k := setup(t)
	const group = "g-versions-removed"
	cfg := config(k, group)
	produceVersion(t, k, "acct", "1")
	produceVersion(t, k, "acct", "3")
	r1, err := txn.New(cfg, txn.Options{TransactionalID: "removed-1", Versions: &sequence.Config{GapTimeout: time.Hour}}, versioned(t))
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r1)
	testenv.WaitFor(t, 20*time.Second, "3 parked", func() bool { return r1.Stats().Kafka.GapsDetected == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	var logs testenv.LogBuffer
	unversioned := func(id string) error {
		t.Helper()
		c := cfg
		c.Logger = logs.Logger()
		r, err := txn.New(c, txn.Options{TransactionalID: id}, enrich)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		errc := make(chan error, 1)
		go func() { errc <- r.Run(ctx) }()
		testenv.WaitFor(t, 20*time.Second, "the runner to run or refuse", func() bool { return r.Stats().Assigned > 0 || len(errc) > 0 })
		cancel()
		return <-errc
	}
	err = unversioned("removed-2")
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Versions" || !strings.Contains(err.Error(), txn.VersionsTopic(group, "in")) {
		t.Fatalf("Run without Versions: %v; want a ConfigError on Versions naming the changelog", err)
	}

	r3, err := txn.New(cfg, txn.Options{TransactionalID: "removed-3", Versions: &sequence.Config{GapTimeout: time.Millisecond}}, versioned(t))
	if err != nil {
		t.Fatal(err)
	}
	stop = runFor(t, r3)
	testenv.WaitFor(t, 20*time.Second, "3 timed out", func() bool { return r3.Stats().Kafka.GapsTimedOut == 1 && r3.Stats().Commits > 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := unversioned("removed-4"); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run without Versions, no record waiting: %v", err)
	}
	// The changelog it read through at start, of no use to it now, is
	// named, with what to do.
	if l := logs.String(); !strings.Contains(l, "hold no parked record") || !strings.Contains(l, txn.VersionsTopic(group, "in")) {
		t.Fatalf("the runner that started without Versions did not name the changelog it reads at every start:\n%s", l)
	}
}
