package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// batchLedger is a batch handler that fails records by their value and
// keeps, per key, the values that succeeded, in the order they did.
type batchLedger struct {
	mu      sync.Mutex
	byKey   map[string][]string
	calls   [][]string
	seen    map[string]int // calls that included each value
	largest int
}

func newBatchLedger() *batchLedger {
	return &batchLedger{byKey: map[string][]string{}, seen: map[string]int{}}
}

func (l *batchLedger) HandleBatch(_ context.Context, recs []*consumer.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var vals []string
	for _, r := range recs {
		vals = append(vals, string(r.Value))
		l.seen[string(r.Value)]++
	}
	l.calls = append(l.calls, vals)
	l.largest = max(l.largest, len(recs))
	for i, r := range recs {
		v := string(r.Value)
		switch {
		case v == "poison":
			l.succeed(recs[:i])
			return consumer.FailedAt(i, consumer.DecodeError(errors.New("not JSON")))
		case v == "flaky" && l.seen[v] < 3:
			l.succeed(recs[:i])
			return consumer.FailedAt(i, consumer.Retryable(errors.New("gateway 503")))
		case v == "boom" && l.seen[v] == 1:
			return errors.New("the batch's connection broke")
		case v == "panic" && l.seen[v] == 1:
			panic("a bad record")
		}
	}
	l.succeed(recs)
	return nil
}

func (l *batchLedger) succeed(recs []*consumer.Record) {
	for _, r := range recs {
		l.byKey[string(r.Key)] = append(l.byKey[string(r.Key)], string(r.Value))
	}
}

// A batch handler sees the queued records of a key-shard together; each
// record's outcome is its own. The records before a FailedAt succeed once;
// the failed record is routed by its class (poison to the DLT at once,
// flaky retried in place with the handler given it alone), and the records
// of its key after it succeed after it. A plain error and a panic isolate
// the batch: its records are handled one by one. Per-key order holds
// throughout.
func TestBatchHandlerOutcomePerRecord(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "batch-payments", "g-batch"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	values := map[string][]string{
		"a": {"a1", "poison", "a2", "a3"},
		"b": {"b1", "flaky", "b2"},
		"c": {"c1", "boom", "c2"},
		"d": {"d1", "panic", "d2"},
		"e": {"e1", "e2", "e3"},
	}
	var recs []*kgo.Record
	for i := range 4 {
		for _, key := range []string{"a", "b", "c", "d", "e"} {
			if i < len(values[key]) {
				recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(values[key][i])})
			}
		}
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	l := newBatchLedger()
	cfg := baseConfig(t, k, group, topic)
	cfg.Shards = 1
	cfg.Failures = fastFailures(retrytopic.Policy{})
	r, err := consumer.NewBatch(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == int64(len(recs)) })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.largest < 2 {
		t.Fatalf("no call saw more than one record: %v", l.calls)
	}
	want := map[string][]string{
		"a": {"a1", "a2", "a3"},
		"b": {"b1", "flaky", "b2"},
		"c": {"c1", "boom", "c2"},
		"d": {"d1", "panic", "d2"},
		"e": {"e1", "e2", "e3"},
	}
	for key, w := range want {
		if got := l.byKey[key]; !slices.Equal(got, w) {
			t.Errorf("key %s succeeded as %v, want %v (calls %v)", key, got, w, l.calls)
		}
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || string(dlt[0].Value) != "poison" || string(dlt[0].Key) != "a" {
		t.Fatalf("DLT holds %d records, want the poison record alone", len(dlt))
	}
	if got := l.seen["flaky"]; got != 3 {
		t.Errorf("flaky was in %d calls, want 3 (a batch, then two retries in place)", got)
	}
	if fs := r.Stats().Failures; fs.DeadLettered != 1 {
		t.Errorf("failure stats %+v: want 1 dead-lettered", fs)
	}
}

// A record's handler is called in a one-record batch while the record
// retries in place.
func TestBatchHandlerRetriesAloneInPlace(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "batch-retries", "g-batch-retries"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 10 {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint("k", i%3)), Value: []byte(fmt.Sprint("v", i))})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var sizes []int
	failed := false
	cfg := baseConfig(t, k, group, topic)
	cfg.Shards = 1
	cfg.Failures = fastFailures(retrytopic.Policy{})
	r, err := consumer.NewBatch(cfg, consumer.BatchHandlerFunc(func(_ context.Context, recs []*consumer.Record) error {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(recs))
		for i, rec := range recs {
			if string(rec.Value) == "v4" && !failed {
				failed = true
				return consumer.FailedAt(i, consumer.Retryable(errors.New("busy")))
			}
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == int64(len(recs)) })
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(sizes, 1) {
		t.Fatalf("call sizes %v: the retry in place did not call the handler with the record alone", sizes)
	}
}

func TestNewBatchRefusesANilHandler(t *testing.T) {
	_, err := consumer.NewBatch(consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}}, nil)
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("NewBatch(nil) = %v, want a *consumer.ConfigError", err)
	}
}

func TestFailedAtIsFoundThroughWrapping(t *testing.T) {
	err := fmt.Errorf("handler: %w", consumer.FailedAt(3, consumer.Terminal(errors.New("bad"))))
	i, rerr, ok := consumer.FailedIndex(err)
	if !ok || i != 3 || consumer.ClassOf(rerr) != consumer.ClassTerminal {
		t.Fatalf("FailedIndex = %d, %v, %v; want 3, a terminal error, true", i, rerr, ok)
	}
	var be *consumer.BatchError
	if !errors.As(err, &be) || be.Index != 3 {
		t.Fatalf("errors.As found %+v", be)
	}
	if _, _, ok := consumer.FailedIndex(errors.New("plain")); ok {
		t.Fatal("a plain error read as a FailedAt")
	}
}

// Records Config.Keep filters out never reach a batch handler; the records
// around them are batched on each side, and every record is done.
func TestBatchHandlerSeesOnlyAdmittedRecords(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "batch-keep", "g-batch-keep"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 12 {
		v := fmt.Sprint("v", i)
		if i%4 == 3 {
			v = "drop"
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint("k", i%3)), Value: []byte(v)})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	cfg := baseConfig(t, k, group, topic)
	cfg.Shards = 1
	cfg.Keep = func(r *consumer.Record) bool { return string(r.Value) != "drop" }
	r, err := consumer.NewBatch(cfg, consumer.BatchHandlerFunc(func(_ context.Context, recs []*consumer.Record) error {
		mu.Lock()
		defer mu.Unlock()
		for _, rec := range recs {
			seen = append(seen, string(rec.Value))
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == int64(len(recs)) })
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(seen, "drop") || len(seen) != 9 {
		t.Fatalf("the handler saw %v: want the 9 records Keep admits", seen)
	}
}
