package kscopeprom_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/kscopeprom"
)

// Filtered and expired records are counted by outcome, and a handler call
// that runs on past HandlerTimeout and HandlerGrace in
// kscope_handler_overruns_total.
func TestHandlerCallMetrics(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "prom-keep", "g-prom-keep"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx,
		&kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("dropped"), Headers: []kgo.RecordHeader{{Key: "drop", Value: []byte("1")}}},
		&kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("old"), Timestamp: time.Now().Add(-time.Hour)},
		&kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("hangs")},
	); err != nil {
		t.Fatal(err)
	}
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	r, err := consumer.New(consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{topic}, CommitInterval: 50 * time.Millisecond,
		Keep:   func(r *consumer.Record) bool { _, drop := r.Header("drop"); return !drop },
		MaxAge: time.Minute, Expired: consumer.ExpiredSkip,
		HandlerTimeout: 50 * time.Millisecond, HandlerGrace: 50 * time.Millisecond,
		Hooks: []hook.Hook{m}, Logger: slog.New(slog.DiscardHandler),
	}, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		<-release // ignores its context
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		<-done
	}()
	labels := map[string]string{"consumer_group": group, "topic": topic}
	testenv.WaitFor(t, time.Minute, "the overrun counted", func() bool {
		return value(t, m.Gatherer(), "kscope_handler_overruns_total", labels) == 1
	})
	close(release)
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == 3 })
	for _, out := range []string{"filtered", "expired", "success"} {
		l := map[string]string{"consumer_group": group, "topic": topic, "outcome": out}
		if v := value(t, m.Gatherer(), "kscope_records_processed_total", l); v != 1 {
			t.Errorf("kscope_records_processed_total{outcome=%q} = %v, want 1", out, v)
		}
	}
}
