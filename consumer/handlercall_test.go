package consumer_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// keepUnlessDropped is a Config.Keep that filters out records with a "drop"
// header and those of key "noise".
func keepUnlessDropped(r *consumer.Record) bool {
	_, drop := r.Header("drop")
	return !drop && string(r.Key) != "noise"
}

// filterRecords are one key's records with a filtered one between two
// kept ones, and a key whose records are all filtered.
func filterRecords(topic string) []*kgo.Record {
	return []*kgo.Record{
		{Topic: topic, Key: []byte("acct"), Value: []byte("a1")},
		{Topic: topic, Key: []byte("acct"), Value: []byte("a2"), Headers: []kgo.RecordHeader{{Key: "drop", Value: []byte("1")}}},
		{Topic: topic, Key: []byte("acct"), Value: []byte("a3")},
		{Topic: topic, Key: []byte("noise"), Value: []byte("n1")},
		{Topic: topic, Key: []byte("acct"), Value: []byte("a4")},
	}
}

// Keep filters records out by header and by key before any handler: the
// kept records of a key are handled in order around a filtered one, the
// filtered ones end with outcome filtered (error ErrFiltered), are counted
// in Stats.Filtered and not as business skips, are not logged above DEBUG,
// and their offsets are committed: a restart does not deliver them again.
func TestKeepFiltersInKeyOrder(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "src-keep", "g-keep"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, filterRecords(topic)...); err != nil {
		t.Fatal(err)
	}
	var handled seen
	var logs testenv.LogBuffer
	outs := testenv.NewOutcomes()
	cfg := baseConfig(t, k, group, topic)
	cfg.Keep = keepUnlessDropped
	cfg.Logger = logs.Logger()
	cfg.Hooks = []hook.Hook{outs}
	h := consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error { handled.add(string(r.Value)); return nil })
	r, err := consumer.New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == 5 })
	testenv.WaitFor(t, time.Minute, "offsets committed past the filtered records", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(handled.all(), ","); got != "a1,a3,a4" {
		t.Fatalf("handled %s; want a1,a3,a4 in order (a2 and n1 filtered)", got)
	}
	st := r.Stats()
	if st.Filtered != 2 || st.Failures.Skipped != 0 || st.Expired != 0 {
		t.Fatalf("Stats: Filtered %d, Failures.Skipped %d, Expired %d; want 2, 0, 0", st.Filtered, st.Failures.Skipped, st.Expired)
	}
	for _, v := range []string{"a2", "n1"} {
		e, ok := outs.Last(v)
		if !ok || e.Outcome != hook.OutcomeFiltered || !errors.Is(e.Err, consumer.ErrFiltered) {
			t.Fatalf("%s ended %+v; want outcome filtered with ErrFiltered", v, e)
		}
	}
	if got := outs.Outcome("a3"); got != hook.OutcomeSuccess {
		t.Fatalf("a3 ended %q; want success", got)
	}
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "filtered") && !strings.Contains(l, "level=DEBUG") {
			t.Fatalf("a filtered record was logged above DEBUG: %s", l)
		}
	}

	// A restart starts after them: only the new record is delivered.
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("acct"), Value: []byte("a5")}); err != nil {
		t.Fatal(err)
	}
	var again seen
	r2, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error { again.add(string(r.Value)); return nil }))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r2)
	testenv.WaitFor(t, time.Minute, "the new record done", func() bool { return r2.Stats().Done >= 1 })
	if got := strings.Join(again.all(), ","); got != "a5" || r2.Stats().Filtered != 0 {
		t.Fatalf("after a restart: handled %q, Filtered %d; want only a5, none filtered again", got, r2.Stats().Filtered)
	}
}

// oldRecords are a record older than MaxAge between two fresh ones of its
// key.
func oldRecords(topic string) []*kgo.Record {
	return []*kgo.Record{
		{Topic: topic, Key: []byte("acct"), Value: []byte("fresh-1")},
		{Topic: topic, Key: []byte("acct"), Value: []byte("old"), Timestamp: time.Now().Add(-time.Hour)},
		{Topic: topic, Key: []byte("acct"), Value: []byte("fresh-2")},
	}
}

// MaxAge expires a record older than it before any handler, in its key's
// order: ExpiredSkip skips it (outcome expired), ExpiredDeadLetter sends
// it to the DLT with its failure metadata (outcome dead_lettered); both
// count it in Stats.Expired and commit its offset.
func TestMaxAge(t *testing.T) {
	for _, tc := range []struct {
		name    string
		action  consumer.ExpiredAction
		outcome hook.Outcome
		dlt     int
	}{
		{"skip", consumer.ExpiredSkip, hook.OutcomeExpired, 0},
		{"dead-letter", consumer.ExpiredDeadLetter, hook.OutcomeDeadLettered, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			k := testenv.KafkaT(t)
			const topic, group = "src-age", "g-age"
			if err := k.CreateTopic(ctx, topic, 1); err != nil {
				t.Fatal(err)
			}
			recs := oldRecords(topic)
			if err := k.Produce(ctx, recs...); err != nil {
				t.Fatal(err)
			}
			var handled seen
			outs := testenv.NewOutcomes()
			cfg := baseConfig(t, k, group, topic)
			cfg.MaxAge, cfg.Expired = time.Minute, tc.action
			cfg.Hooks = []hook.Hook{outs}
			r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error { handled.add(string(r.Value)); return nil }))
			if err != nil {
				t.Fatal(err)
			}
			stop := runAsync(t, r)
			testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == 3 })
			testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(handled.all(), ","); got != "fresh-1,fresh-2" {
				t.Fatalf("handled %s; want fresh-1,fresh-2", got)
			}
			e, _ := outs.Last("old")
			if e.Outcome != tc.outcome || !errors.Is(e.Err, consumer.ErrExpired) {
				t.Fatalf("old ended %+v; want outcome %s with ErrExpired", e, tc.outcome)
			}
			if st := r.Stats(); st.Expired != 1 || st.Failures.DeadLettered != int64(tc.dlt) || st.Failures.Skipped != 0 {
				t.Fatalf("Stats: Expired %d, DeadLettered %d, Skipped %d; want 1, %d, 0", st.Expired, st.Failures.DeadLettered, st.Failures.Skipped, tc.dlt)
			}
			if tc.dlt == 0 {
				return
			}
			dlt := k.ReadAll(t, retrytopic.DLTopic(group))
			if len(dlt) != 1 || string(dlt[0].Value) != "old" {
				t.Fatalf("DLT holds %d records; want the old one", len(dlt))
			}
			for h, want := range map[string]string{
				retrytopic.HeaderErrorClass:      "terminal",
				consumer.HeaderOriginalOffset:    "1",
				consumer.HeaderOriginalTimestamp: strconv.FormatInt(recs[1].Timestamp.UnixMilli(), 10),
			} {
				if got := testenv.Header(dlt[0], h); got != want {
					t.Errorf("DLT header %s = %q, want %q", h, got, want)
				}
			}
			if msg := testenv.Header(dlt[0], retrytopic.HeaderError); !strings.Contains(msg, "expired") {
				t.Errorf("DLT error header %q does not say the record expired", msg)
			}
		})
	}
}

// A record that waited in the retry topics past MaxAge expires by its
// original timestamp, though the retry record itself is new; and Keep is
// not asked again about a retry-topic record (here it would filter it out).
func TestMaxAgeCountsFromTheOriginalRecord(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "src-age-retry", "g-age-retry"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("acct"), Value: []byte("slow")}); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	outs := testenv.NewOutcomes()
	cfg := baseConfig(t, k, group, topic)
	cfg.MaxAge, cfg.Expired = time.Second, consumer.ExpiredSkip
	cfg.Keep = func(r *consumer.Record) bool { return r.Topic == topic }
	cfg.Failures = fastFailures(retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, Ladder: []time.Duration{100 * time.Millisecond}})
	cfg.Hooks = []hook.Hook{outs}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
		calls.Add(1)
		// Fail once the record is older than MaxAge: its retry record,
		// produced now, is not.
		testenv.WaitFor(t, time.Minute, "the record older than MaxAge", func() bool { return time.Since(r.Timestamp) > cfg.MaxAge })
		return consumer.Retryable(errors.New("dependency down"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the retry record expired", func() bool { return r.Stats().Expired == 1 })
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler called %d times; want 1 (the retry record expires before its handler)", n)
	}
	if st := r.Stats(); st.Filtered != 0 || st.Failures.RetryTopic != 1 {
		t.Fatalf("Stats: Filtered %d, RetryTopic %d; want 0, 1", st.Filtered, st.Failures.RetryTopic)
	}
	if got := outs.Outcome("slow"); got != hook.OutcomeExpired {
		t.Fatalf("the retry delivery ended %q; want expired", got)
	}
}
