package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/outbox"
	"github.com/kscope-dev/kscope/retrytopic"
)

// A DB-scope pipeline writes an event to the outbox in each record's
// transaction; the relay publishes each event once. A record whose handler
// fails after its Add writes no event.
func TestOutboxFromDBScopeHandlers(t *testing.T) {
	ctx := context.Background()
	k, pool, _ := setup(t)
	if err := k.CreateTopic(ctx, "payments.captured", 2); err != nil {
		t.Fatal(err)
	}
	w := outbox.Writer{Partitions: 2}
	{
		group := "g-outbox-exec"
		cfg := consumer.Config{Brokers: k.Brokers, Group: group, Topics: []string{"payments.captured"},
			CommitInterval: 50 * time.Millisecond, Logger: logger(),
			Failures: retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, DisableRetryTopics: true}}
		event := func(r *consumer.Record) *kgo.Record {
			return &kgo.Record{Topic: "payments.booked", Key: r.Key, Value: append([]byte(group+":"), r.Value...)}
		}
		r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, rec *consumer.Record) error {
			if _, err := w.Add(ctx, tx, event(rec)); err != nil {
				return err
			}
			if string(rec.Value) == "poison" {
				return consumer.DecodeError(errors.New("unreadable"))
			}
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		for _, v := range []string{"a", "poison", "b"} {
			if err := k.Produce(ctx, &kgo.Record{Topic: "payments.captured", Key: []byte(v), Value: []byte(v)}); err != nil {
				t.Fatal(err)
			}
		}
		testenv.WaitFor(t, time.Minute, "the records consumed", func() bool { return k.CaughtUp(ctx, group, "payments.captured") })
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	relay, stop := runRelay(t, outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 2, OwnPartitions: []int{0, 1}, Logger: logger(), PollInterval: 20 * time.Millisecond})
	testenv.WaitFor(t, time.Minute, "the events published", func() bool { return relay.Stats().Published >= 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range k.ReadAll(t, "payments.booked") {
		got[string(r.Value)]++
	}
	for _, want := range []string{"g-outbox-exec:a", "g-outbox-exec:b"} {
		if got[want] != 1 {
			t.Errorf("event %s published %d times; all: %v", want, got[want], got)
		}
	}
	if len(got) != 2 {
		t.Errorf("published %v, want the events of the applied records only", got)
	}
}
