package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// With a PostgreSQL or Redis store that goes down for real (its database
// refuses connections; the server is stopped), each Unavailable setting
// does what DedupeConfig says. m0 is handled and remembered before the
// outage; m1, a copy of m0 and m2 (one key: one key-shard) arrive during
// it.
//
//   - FailClosed: nothing is handled while the store is down; once it is
//     back, m1 and m2 are handled once each, and the copy of m0 is a
//     duplicate if the store kept m0 (PostgreSQL) and handled again if it
//     lost it (the test's Redis keeps nothing across a restart).
//   - FailOpen: the three records are handled without the store, counted
//     unavailable (the copy of m0 too: nobody asked), and none of them is
//     remembered (Remember failed too): once the store is back, m1
//     produced again is handled again.
func TestDedupeStoresDown(t *testing.T) {
	for _, b := range guardBackends() {
		if b.name == "memory" {
			continue // it cannot be down; TestDedupeStoreDown covers a failing store
		}
		for _, mode := range []consumer.DedupeUnavailable{consumer.FailClosed, consumer.FailOpen} {
			t.Run(b.name+"/"+mode.String(), func(t *testing.T) { testStoreDown(t, b, mode) })
		}
	}
}

func testStoreDown(t *testing.T, b guardBackend, mode consumer.DedupeUnavailable) {
	ctx := context.Background()
	store, down, up := b.open(t, true)
	k := testenv.KafkaT(t)
	topic, group := "dds-down-"+b.name+"-"+mode.String(), "g-dds-down-"+b.name+"-"+mode.String()
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var c calls
	cfg := baseConfig(t, k, group, topic)
	cfg.Dedupe = consumer.DedupeConfig{Store: store, Unavailable: mode}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error { c.add(r); return nil }))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	if err := k.Produce(ctx, msg(topic, "a", "m0", "0")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "m0 handled before the outage", func() bool { return k.CaughtUp(ctx, group, topic) && c.get("m0") == 1 })
	down()
	if err := k.Produce(ctx, msg(topic, "a", "m1", "1"), msg(topic, "a", "m0", "0 again"), msg(topic, "a", "m2", "2")); err != nil {
		t.Fatal(err)
	}
	if mode == consumer.FailOpen {
		testenv.WaitFor(t, time.Minute, "the records handled without the store", func() bool { return k.CaughtUp(ctx, group, topic) })
		if st := r.Stats().Dedupe; st.Unavailable != 3 || st.StoreErrors == 0 || st.Hits != 0 {
			t.Errorf("Stats().Dedupe = %+v; want 3 unavailable, no hit, the store's errors", st)
		}
		up()
		if err := k.Produce(ctx, msg(topic, "a", "m1", "1 again")); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, time.Minute, "m1 produced again handled", func() bool { return k.CaughtUp(ctx, group, topic) && c.get("m1") == 2 })
		expectCalls(t, &c, map[string]int{"m0": 2, "m1": 2, "m2": 1})
		return
	}
	testenv.WaitFor(t, time.Minute, "the store's errors", func() bool { return r.Stats().Dedupe.StoreErrors >= 2 })
	if n := c.get("m1") + c.get("m2"); n != 0 || c.get("m0") != 1 {
		t.Fatalf("records handled while the store was down with FailClosed (m0 %d, m1 %d, m2 %d calls)", c.get("m0"), c.get("m1"), c.get("m2"))
	}
	up()
	testenv.WaitFor(t, 2*time.Minute, "the records handled once the store is back", func() bool { return k.CaughtUp(ctx, group, topic) })
	want := map[string]int{"m0": 2, "m1": 1, "m2": 1}
	hits := int64(0)
	if b.keeps {
		want["m0"], hits = 1, 1
	}
	expectCalls(t, &c, want)
	if st := r.Stats().Dedupe; st.Unavailable != 0 || st.Hits != hits {
		t.Errorf("Stats().Dedupe = %+v; want none unavailable, %d hit", st, hits)
	}
	expectRemembered(t, store, group, []string{"m0", "m1", "m2"}, []bool{true, true, true})
}

func expectCalls(t *testing.T, c *calls, want map[string]int) {
	t.Helper()
	for id, n := range want {
		if got := c.get(id); got != n {
			t.Errorf("message %s handled %d times; want %d", id, got, n)
		}
	}
}
