package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// With a batch handler (consumer.NewBatch), the guard holds as with a
// per-record one: a message is handled once whether its copy falls in the
// same batch or a later one, no batch holds two copies of one message, a
// record that fails (its batch's FailedAt) leaves no mark and its message
// sent again is handled, and the records after the failing one are
// handled once.
func TestDedupeBatchHandler(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "dd-batch", "g-dd-batch"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	first := []*kgo.Record{
		msg(topic, "a", "m1", "1"), msg(topic, "b", "m2", "2"), msg(topic, "a", "m1", "1 again"),
		msg(topic, "c", "m3", "bad"), msg(topic, "d", "m4", "4"), msg(topic, "b", "m2", "2 again"),
	}
	if err := k.Produce(ctx, first...); err != nil {
		t.Fatal(err)
	}
	var c calls
	var mu sync.Mutex
	var twice []string // messages seen twice in one batch
	o := &outcomes{}
	store := dedupe.NewMemory(0)
	cfg := baseConfig(t, k, group, topic)
	cfg.Dedupe = consumer.DedupeConfig{Store: store}
	cfg.Hooks = []hook.Hook{o}
	r, err := consumer.NewBatch(cfg, consumer.BatchHandlerFunc(func(_ context.Context, recs []*consumer.Record) error {
		in := map[string]bool{}
		for i, rec := range recs {
			id, _ := rec.Header(consumer.DefaultMessageIDHeader)
			if in[string(id)] {
				mu.Lock()
				twice = append(twice, string(id))
				mu.Unlock()
			}
			in[string(id)] = true
			if string(rec.Value) == "bad" {
				return consumer.FailedAt(i, consumer.Terminal(errors.New("rejected")))
			}
			c.add(rec)
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the first records committed", func() bool { return k.CaughtUp(ctx, group, topic) })
	stored := func(id string) string { return fmt.Sprintf("%d:%s:%s", len(group), group, id) }
	if seen, _ := store.Seen(ctx, []string{stored("m3")}); seen[0] {
		t.Fatal("the store remembers m3, whose record failed")
	}
	if err := k.Produce(ctx, msg(topic, "b", "m2", "2 once more"), msg(topic, "c", "m3", "3"), msg(topic, "e", "m5", "5")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the later records committed", func() bool { return k.CaughtUp(ctx, group, topic) && c.get("m5") == 1 })
	for _, id := range []string{"m1", "m2", "m3", "m4", "m5"} {
		if n := c.get(id); n != 1 {
			t.Errorf("message %s handled %d times; want once", id, n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(twice) > 0 {
		t.Errorf("batches held two copies of %v", twice)
	}
	if st := r.Stats().Dedupe; st.Hits != 3 || st.Remembered != 5 {
		t.Errorf("Stats.Dedupe %+v; want 3 hits (m1 once, m2 twice), 5 remembered", st)
	}
	if n := o.get(hook.OutcomeDuplicate); n != 3 {
		t.Errorf("%d deliveries ended duplicate; want 3", n)
	}
}
