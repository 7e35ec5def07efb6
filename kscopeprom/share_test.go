package kscopeprom_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/kscopeprom"
)

// runShare runs r until the returned stop is called, and returns Run's
// error then.
func runShare(t *testing.T, r *consumer.Runner) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error { once.Do(func() { cancel(); err = <-errc }); return err }
	t.Cleanup(func() { stop() })
	return stop
}

// A share group's metrics follow its members: a record held by a
// handler is in flight; a member that stops releases it; the next member,
// past MaxDeliveries, dead-letters it (accepted, deliveries exhausted),
// and the group's backlog is 0. The counters of both members add up, and
// promtool's lint passes. Records written while no member runs wait in
// the backlog.
func TestShareGroupMetrics(t *testing.T) {
	k := testenv.KafkaT(t, kfake.BrokerConfigs(map[string]string{
		"group.share.heartbeat.interval.ms":   "100",
		"share.record.lock.sweep.interval.ms": "100",
	}))
	ctx := context.Background()
	const topic, group = "jobs", "g-share-metrics"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := consumer.Config{Brokers: k.Brokers, Group: group, Topics: []string{topic}, DrainTimeout: 200 * time.Millisecond,
		Share: &consumer.ShareConfig{MaxDeliveries: 1}, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))}
	started := make(chan struct{})
	var once sync.Once
	a, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, _ *consumer.Record) error {
		once.Do(func() { close(started) })
		<-ctx.Done() // runs until the member stops
		return ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.WatchShare(a); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() { watched <- m.WatchShareGroup(wctx, cfg, 50*time.Millisecond) }()
	defer func() {
		cancel()
		if err := <-watched; err != nil {
			t.Error(err)
		}
	}()
	g, byGroup := m.Gatherer(), map[string]string{"consumer_group": group}
	backlog := map[string]string{"consumer_group": group, "topic": topic, "partition": "0"}
	stopA := runShare(t, a)
	// Written once the member is ready: the runner sets the group's start
	// (share.auto.offset.reset) once its client runs.
	testenv.WaitFor(t, 30*time.Second, "the member ready", func() bool { return a.Health().Ready })
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("stuck")}); err != nil {
		t.Fatal(err)
	}
	<-started
	testenv.WaitFor(t, time.Minute, "the record in flight", func() bool { return value(t, g, "kscope_share_in_flight_records", byGroup) == 1 })
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	if n := value(t, g, "kscope_share_released_total", byGroup); n != 1 {
		t.Fatalf("kscope_share_released_total %v, want 1", n)
	}

	b, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.WatchShare(b); err != nil {
		t.Fatal(err)
	}
	if err := m.WatchShare(b); err != nil { // twice: a no-op
		t.Fatal(err)
	}
	stopB := runShare(t, b)
	testenv.WaitFor(t, time.Minute, "the record dead-lettered past MaxDeliveries and the backlog empty", func() bool {
		return value(t, g, "kscope_share_deliveries_exhausted_total", byGroup) == 1 && value(t, g, "kscope_share_backlog_records", backlog) == 0 &&
			series(t, g, "kscope_share_backlog_records") == 1
	})
	for name, want := range map[string]float64{"kscope_share_accepted_total": 1, "kscope_share_released_total": 1, "kscope_share_redelivered_total": 1,
		"kscope_share_in_flight_records": 0, "kscope_share_acks_refused_total": 0, "kscope_share_lock_renewals_total": 0} {
		if got := value(t, g, name, byGroup); got != want {
			t.Errorf("%s %v, want %v", name, got, want)
		}
	}
	promtoolLint(t, m)

	// With no member running, records written wait in the backlog.
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte("a")}, &kgo.Record{Topic: topic, Value: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "two records in the backlog", func() bool { return value(t, g, "kscope_share_backlog_records", backlog) == 2 })
}

// WatchShare and WatchShareGroup refuse what is not a share group's at
// once, with a sentence that says what to give.
func TestShareWatchersRefuseAConsumerGroup(t *testing.T) {
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := consumer.Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.WatchShare(r); err == nil || !strings.Contains(err.Error(), "needs a share-group runner (consumer.Config.Share set)") {
		t.Fatalf("WatchShare of a consumer group's runner: %v", err)
	}
	if err := m.WatchShareGroup(context.Background(), cfg, 0); err == nil || !strings.Contains(err.Error(), "with its Brokers, Group and Share") {
		t.Fatalf("WatchShareGroup of a consumer group: %v", err)
	}
	cfg.Share = &consumer.ShareConfig{}
	if err := m.WatchShareGroup(context.Background(), cfg, -time.Second); err == nil || !strings.Contains(err.Error(), "positive") {
		t.Fatalf("negative interval: %v", err)
	}
}
