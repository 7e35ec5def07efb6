package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// msg is a record with the producer's message id.
func msg(topic, key, id, value string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value), Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}}
}

// calls counts the handler's calls per message id.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(r *consumer.Record) {
	id, _ := r.Header(consumer.DefaultMessageIDHeader)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[string(id)]++
}

func (c *calls) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// outcomes is a hook that counts deliveries by outcome.
type outcomes struct {
	mu sync.Mutex
	n  map[hook.Outcome]int
}

func (o *outcomes) OnRecordStart(ctx context.Context, _ hook.RecordStart) context.Context { return ctx }
func (o *outcomes) OnRecordEnd(_ context.Context, e hook.RecordEnd) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[hook.Outcome]int{}
	}
	o.n[e.Outcome]++
}
func (o *outcomes) get(out hook.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[out]
}

// With Config.Dedupe, a record whose message id an earlier record of it
// succeeded with is not handled again, in the same batch or a later one:
// it is committed and counted as a duplicate.
func TestDedupeSkipsDuplicates(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "dd-skip", "g-dd-skip"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, msg(topic, "a", "m1", "1"), msg(topic, "b", "m2", "2"), msg(topic, "a", "m1", "1 again"), msg(topic, "c", "m3", "3")); err != nil {
		t.Fatal(err)
	}
	var c calls
	o := &outcomes{}
	store := dedupe.NewMemory(0)
	cfg := baseConfig(t, k, group, topic)
	cfg.Dedupe = consumer.DedupeConfig{Store: store}
	cfg.Hooks = []hook.Hook{o}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error { c.add(r); return nil }))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the first records committed", func() bool { return k.CaughtUp(ctx, group, topic) })
	if err := k.Produce(ctx, msg(topic, "b", "m2", "2 again"), msg(topic, "d", "m4", "4")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the later records committed", func() bool { return k.CaughtUp(ctx, group, topic) && c.get("m4") == 1 })
	for _, id := range []string{"m1", "m2", "m3", "m4"} {
		if n := c.get(id); n != 1 {
			t.Errorf("message %s handled %d times; want once", id, n)
		}
	}
	if st := r.Stats().Dedupe; st.Hits != 2 || st.Remembered != 4 {
		t.Errorf("Stats.Dedupe %+v; want 2 hits, 4 remembered", st)
	}
	if n := o.get(hook.OutcomeDuplicate); n != 2 {
		t.Errorf("%d deliveries ended duplicate; want 2", n)
	}
}

// A record that fails leaves no mark: the same message sent again is
// handled.
func TestDedupeFailureLeavesNoMark(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "dd-fail", "g-dd-fail"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, msg(topic, "a", "m1", "bad")); err != nil {
		t.Fatal(err)
	}
	var c calls
	store := dedupe.NewMemory(0)
	cfg := baseConfig(t, k, group, topic)
	cfg.Dedupe = consumer.DedupeConfig{Store: store}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error {
		c.add(r)
		if string(r.Value) == "bad" {
			return consumer.Terminal(errors.New("rejected"))
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the failing record dead-lettered", func() bool { return k.CaughtUp(ctx, group, topic) })
	stored := fmt.Sprintf("%d:%s:m1", len(group), group) // the group goes before the identity
	if seen, _ := store.Seen(ctx, []string{stored}); seen[0] {
		t.Fatal("the store remembers m1, whose handler failed")
	}
	if err := k.Produce(ctx, msg(topic, "a", "m1", "good")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the message sent again handled", func() bool { return c.get("m1") == 2 && k.CaughtUp(ctx, group, topic) })
	if seen, _ := store.Seen(ctx, []string{stored}); !seen[0] {
		t.Error("the store does not remember m1 once its handler succeeded")
	}
}

// flaky is a dedupe store that fails while down.
type flaky struct {
	dedupe.Store
	down atomic.Bool
}

var errStoreDown = errors.New("dedupe store: connection refused")

func (f *flaky) Seen(ctx context.Context, ids []string) ([]bool, error) {
	if f.down.Load() {
		return nil, errStoreDown
	}
	return f.Store.Seen(ctx, ids)
}

func (f *flaky) Remember(ctx context.Context, ids []string, ttl time.Duration) error {
	if f.down.Load() {
		return errStoreDown
	}
	return f.Store.Remember(ctx, ids, ttl)
}

// While the store does not answer, FailClosed handles nothing and goes on
// once it is back; FailOpen handles the records, counting each as
// unguarded. The same holds with a batch handler (consumer.NewBatch).
func TestDedupeStoreDown(t *testing.T) {
	for _, batch := range []bool{false, true} {
		for _, mode := range []consumer.DedupeUnavailable{consumer.FailClosed, consumer.FailOpen} {
			name := mode.String()
			if batch {
				name = "batch-" + name
			}
			t.Run(name, func(t *testing.T) { testDedupeStoreDown(t, name, mode, batch) })
		}
	}
}

func testDedupeStoreDown(t *testing.T, name string, mode consumer.DedupeUnavailable, batch bool) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	topic, group := "dd-down-"+name, "g-dd-down-"+name
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	store := &flaky{Store: dedupe.NewMemory(0)}
	store.down.Store(true)
	var c calls
	cfg := baseConfig(t, k, group, topic)
	cfg.Dedupe = consumer.DedupeConfig{Store: store, Unavailable: mode}
	h := consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error { c.add(r); return nil })
	var r *consumer.Runner
	var err error
	if batch {
		r, err = consumer.NewBatch(cfg, consumer.BatchHandlerFunc(func(ctx context.Context, recs []*consumer.Record) error {
			for _, rec := range recs {
				h(ctx, rec) //nolint:errcheck // never fails
			}
			return nil
		}))
	} else {
		r, err = consumer.New(cfg, h)
	}
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	if err := k.Produce(ctx, msg(topic, "a", "m1", "1"), msg(topic, "a", "m2", "2")); err != nil {
		t.Fatal(err)
	}
	if mode == consumer.FailOpen {
		testenv.WaitFor(t, time.Minute, "records handled without the store", func() bool { return k.CaughtUp(ctx, group, topic) })
		if st := r.Stats().Dedupe; st.Unavailable != 2 || st.StoreErrors == 0 {
			t.Errorf("Stats.Dedupe %+v; want 2 unavailable and the store's errors", st)
		}
	} else {
		testenv.WaitFor(t, time.Minute, "the store's errors", func() bool { return r.Stats().Dedupe.StoreErrors >= 3 })
		if c.get("m1")+c.get("m2") != 0 {
			t.Fatal("a record was handled while the store was down with FailClosed")
		}
		store.down.Store(false)
		testenv.WaitFor(t, time.Minute, "records handled once the store is back", func() bool { return k.CaughtUp(ctx, group, topic) })
		if st := r.Stats().Dedupe; st.Unavailable != 0 || st.Remembered != 2 {
			t.Errorf("Stats.Dedupe %+v; want none unguarded, 2 remembered", st)
		}
	}
	if c.get("m1") != 1 || c.get("m2") != 1 {
		t.Errorf("m1 handled %d times, m2 %d; want once each", c.get("m1"), c.get("m2"))
	}
}

// Bad Dedupe settings, or a store left out while other fields are set,
// fail New with a sentence that says what to change.
func TestDedupeConfigErrors(t *testing.T) {
	nop := consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil })
	base := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}}
	cases := []struct {
		name  string
		d     consumer.DedupeConfig
		field string
		says  string
	}{
		{"no store", consumer.DedupeConfig{Window: time.Hour}, "Dedupe.Store", "set Store"},
		{"negative window", consumer.DedupeConfig{Store: dedupe.NewMemory(0), Window: -time.Hour}, "Dedupe.Window", "positive duration"},
		{"bad unavailable", consumer.DedupeConfig{Store: dedupe.NewMemory(0), Unavailable: 7}, "Dedupe.Unavailable", "FailClosed or FailOpen"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.Dedupe = tc.d
			_, err := consumer.New(cfg, nop)
			var ce *consumer.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %v; want field %s saying %q", err, tc.field, tc.says)
			}
		})
	}
}

// Two groups that consume the same messages and share a store each handle
// every message once: the runner keeps their identities apart.
func TestDedupeGroupsShareAStore(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic = "dd-shared"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, msg(topic, "a", "m1", "1"), msg(topic, "a", "m1", "1 again")); err != nil {
		t.Fatal(err)
	}
	store := dedupe.NewMemory(0)
	var billing, shipping calls
	for _, g := range []struct {
		group string
		c     *calls
	}{{"g-dd-billing", &billing}, {"g-dd-shipping", &shipping}} {
		cfg := baseConfig(t, k, g.group, topic)
		cfg.Dedupe = consumer.DedupeConfig{Store: store}
		c := g.c
		r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error { c.add(r); return nil }))
		if err != nil {
			t.Fatal(err)
		}
		runAsync(t, r)
		testenv.WaitFor(t, time.Minute, g.group+" caught up", func() bool { return k.CaughtUp(ctx, g.group, topic) })
	}
	if billing.get("m1") != 1 || shipping.get("m1") != 1 {
		t.Errorf("m1 handled %d times by billing and %d by shipping; want once by each", billing.get("m1"), shipping.get("m1"))
	}
}
