package kscopeprom_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/kscopeprom"
	"github.com/kscope-dev/kscope/outbox"
)

// A relay's dead letters and blocked partitions are exported with its
// other counters: a row too large for the relay's producer is counted in
// kscope_outbox_dead_lettered_records_total, the rows around it in the
// published records, and no partition is stuck or halted.
func TestWatchRelayExportsDeadLetters(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	if err := k.CreateTopic(ctx, "orders.shipped", 1); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, testenv.DatabaseT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	w := outbox.Writer{Outbox: "orders", Partitions: 1}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, v := range [][]byte{[]byte("o/0"), bytes.Repeat([]byte("x"), 100<<10), []byte("o/1")} {
			if _, err := w.Add(ctx, tx, &kgo.Record{Topic: "orders.shipped", Key: []byte("o"), Value: v}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r, err := outbox.New(outbox.Options{Brokers: k.Brokers, Pool: pool, Outbox: "orders", Partitions: 1, OwnPartitions: []int{0},
		PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		ClientOptions: []kgo.Opt{kgo.ProducerBatchMaxBytes(64 << 10)}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.WatchRelay(r); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	g := m.Gatherer()
	of := map[string]string{"outbox": "orders"}
	testenv.WaitFor(t, time.Minute, "the rows around the oversized one published", func() bool {
		return value(t, g, "kscope_outbox_published_records_total", of) == 2
	})
	if v := value(t, g, "kscope_outbox_dead_lettered_records_total", of); v != 1 {
		t.Errorf("kscope_outbox_dead_lettered_records_total is %v, want 1", v)
	}
	// The row waits in the dead-letter table for an operator.
	if v := value(t, g, "kscope_outbox_dead_rows", of); v != 1 {
		t.Errorf("kscope_outbox_dead_rows is %v, want 1", v)
	}
	for _, name := range []string{"kscope_outbox_stuck_partitions", "kscope_outbox_halted_partitions"} {
		if n := series(t, g, name); n != 1 {
			t.Errorf("%d series of %s, want 1", n, name)
		}
		if v := value(t, g, name, of); v != 0 {
			t.Errorf("%s is %v, want 0", name, v)
		}
	}
}

// One Metrics watches every relay of a process: two outboxes, and a relay
// built again for an outbox after its first one stopped (the first one's
// counts stay in the outbox's counters, so they do not go back).
func TestWatchRelayOfSeveralRelays(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://kscope@127.0.0.1:1/none") // connects lazily: never, here
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	relay := func(name string) *outbox.Relay {
		r, err := outbox.New(outbox.Options{Brokers: []string{"127.0.0.1:1"}, Pool: pool, Outbox: name, Partitions: 1})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*outbox.Relay{relay("orders"), relay("payments"), relay("orders")} {
		if err := m.WatchRelay(r); err != nil {
			t.Fatalf("watching the relay of outbox %s: %v", r.Outbox(), err)
		}
	}
	g := m.Gatherer()
	if _, err := g.Gather(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kscope_outbox_published_records_total", "kscope_outbox_partitions", "kscope_outbox_stuck_partitions"} {
		if n := series(t, g, name); n != 2 {
			t.Errorf("%d series of %s, want 2 (one per outbox)", n, name)
		}
	}
}
