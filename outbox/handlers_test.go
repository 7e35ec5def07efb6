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
// transaction, from a Handler and from a QueueHandler; the relay publishes
// each event once. A record whose handler fails writes no event.
func TestOutboxFromDBScopeHandlers(t *testing.T) {
	ctx := context.Background()
	k, pool, _ := setup(t)
	w := outbox.Writer{Partitions: 2}
	for _, queued := range []bool{false, true} {
		// Each handler form has an input topic of its own: a group that
		// read the other's records too would write events for them.
		group, in := "g-outbox-exec", "payments.captured.exec"
		if queued {
			group, in = "g-outbox-queued", "payments.captured.queued"
		}
		if err := k.CreateTopic(ctx, in, 2); err != nil {
			t.Fatal(err)
		}
		cfg := consumer.Config{Brokers: k.Brokers, Group: group, Topics: []string{in},
			CommitInterval: 50 * time.Millisecond, Logger: logger(),
			Failures: retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, DisableRetryTopics: true}}
		event := func(r *consumer.Record) *kgo.Record {
			return &kgo.Record{Topic: "payments.booked", Key: r.Key, Value: append([]byte(group+":"), r.Value...)}
		}
		var r interface{ Run(context.Context) error }
		var err error
		if queued {
			r, err = dbscope.NewQueued(cfg, dbscope.Options{Pool: pool}, dbscope.QueueFunc(func(_ context.Context, q *dbscope.Queue, rec *consumer.Record) error {
				if string(rec.Value) == "poison" {
					return consumer.DecodeError(errors.New("unreadable"))
				}
				return w.Queue(q, event(rec))
			}))
		} else {
			r, err = dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, rec *consumer.Record) error {
				if _, err := w.Add(ctx, tx, event(rec)); err != nil {
					return err
				}
				if string(rec.Value) == "poison" {
					return consumer.DecodeError(errors.New("unreadable"))
				}
				return nil
			}))
		}
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		for _, v := range []string{"a", "poison", "b"} {
			if err := k.Produce(ctx, &kgo.Record{Topic: in, Key: []byte(v), Value: []byte(v)}); err != nil {
				t.Fatal(err)
			}
		}
		testenv.WaitFor(t, time.Minute, "the records consumed", func() bool { return k.CaughtUp(ctx, group, in) })
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	relay, stop := runRelay(t, outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 2, OwnPartitions: []int{0, 1}, Logger: logger(), PollInterval: 20 * time.Millisecond})
	testenv.WaitFor(t, time.Minute, "the events published", func() bool { return relay.Stats().Published == 4 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range k.ReadAll(t, "payments.booked") {
		got[string(r.Value)]++
	}
	for _, want := range []string{"g-outbox-exec:a", "g-outbox-exec:b", "g-outbox-queued:a", "g-outbox-queued:b"} {
		if got[want] != 1 {
			t.Errorf("event %s published %d times; all: %v", want, got[want], got)
		}
	}
	if len(got) != 4 {
		t.Errorf("published %v, want the four events of the applied records only", got)
	}
}
