package consumer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// A handler that never returns (a call with no timeout) holds every key of
// its key-shard and the partition's offsets, and, once the in-flight bound
// fills, the consumer; without the stall watch, only the partition's lag
// said anything, and nothing named the record. The watch names it in a
// WARN (topic, partition, offset, key), counts it in Stats and tells the
// hooks, once, and reports the end of the stall once the handler returns.
func TestHungHandlerIsNamed(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic = "src-stall"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	recs := []*kgo.Record{
		{Topic: topic, Key: []byte("before"), Value: []byte("0")},
		{Topic: topic, Key: []byte("hangs"), Value: []byte("1")},
		{Topic: topic, Key: []byte("after"), Value: []byte("2")},
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}

	release := make(chan struct{})
	var mu sync.Mutex
	handled := map[string]int{}
	h := consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error {
		if string(r.Key) == "hangs" {
			<-release // ignores its context, as a call with no timeout does
		}
		mu.Lock()
		handled[string(r.Key)]++
		mu.Unlock()
		return nil
	})
	var logs testenv.LogBuffer
	st := &testenv.Stalls{}
	cfg := baseConfig(t, k, "g-stall", topic)
	cfg.Shards = 1 // "after" waits behind the hung record
	cfg.StallWarning = 300 * time.Millisecond
	cfg.Logger = logs.Logger()
	cfg.Hooks = []hook.Hook{st}
	r, err := consumer.New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	defer close(release)

	testenv.WaitFor(t, time.Minute, "the stall reported", func() bool { return len(st.All()) > 0 })
	got := st.All()[0]
	if got.Ended || got.Topic != topic || got.Partition != 0 || got.Offset != 1 || got.Shard != 0 || got.Group != "g-stall" {
		t.Fatalf("stall reported as %+v; want the hung record %s[0]@1 on key-shard 0 of g-stall, not ended", got, topic)
	}
	if got.For < cfg.StallWarning {
		t.Fatalf("stall reported after %s; want at least StallWarning (%s)", got.For, cfg.StallWarning)
	}
	if n := r.Stats().StalledShards; n != 1 {
		t.Fatalf("Stats().StalledShards = %d while the handler hangs; want 1", n)
	}
	line := ""
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "finished no record") {
			line = l
		}
	}
	for _, want := range []string{"topic=" + topic, "partition=0", "offset=1", "key=hangs", "its handler has not returned"} {
		if !strings.Contains(line, want) {
			t.Fatalf("the stall's WARN %q does not say %q", line, want)
		}
	}
	if len(st.All()) != 1 {
		t.Fatalf("one stall reported %d times: %+v", len(st.All()), st.All())
	}

	release <- struct{}{}
	testenv.WaitFor(t, time.Minute, "the stall's end reported", func() bool { return len(st.All()) == 2 })
	end := st.All()[1]
	if !end.Ended || end.Offset != 1 || end.For < got.For {
		t.Fatalf("end of the stall reported as %+v; want ended, for the same record, lasting at least %s", end, got.For)
	}
	if n := r.Stats().StalledShards; n != 0 {
		t.Fatalf("Stats().StalledShards = %d after the handler returned; want 0", n)
	}
	testenv.WaitFor(t, time.Minute, "every record handled", func() bool { return r.Stats().Done == int64(len(recs)) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "a stalled key-shard moved on") {
		t.Fatal("no log said the stalled key-shard moved on")
	}
	mu.Lock()
	defer mu.Unlock()
	if handled["hangs"] != 1 || handled["after"] != 1 {
		t.Fatalf("handled %v; want the hung record and the one behind it once each", handled)
	}
}

// A stall still on when the runner stops is ended with it: a gauge fed by
// the hook does not keep a stalled key-shard of a runner that is gone.
func TestStallEndsWhenTheRunnerStops(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic = "src-stall-stop"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	h := consumer.HandlerFunc(func(ctx context.Context, _ *consumer.Record) error {
		<-ctx.Done() // holds until the runner stops
		return ctx.Err()
	})
	st := &testenv.Stalls{}
	cfg := baseConfig(t, k, "g-stall-stop", topic)
	cfg.StallWarning = 200 * time.Millisecond
	cfg.DrainTimeout = 200 * time.Millisecond // the handler returns once its context is canceled
	cfg.Hooks = []hook.Hook{st}
	r, err := consumer.New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the stall reported", func() bool { return r.Stats().StalledShards == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got := st.All()
	if len(got) != 2 || got[0].Ended || !got[1].Ended {
		t.Fatalf("stall reports %+v; want the stall and its end", got)
	}
	if n := r.Stats().StalledShards; n != 0 {
		t.Fatalf("Stats().StalledShards = %d after Run returned; want 0", n)
	}
}

// A key-shard that keeps finishing records, each within StallWarning, is
// not stalled, however long its batch takes in all; and a negative
// StallWarning turns the watch off.
func TestSlowHandlerThatMovesIsNotAStall(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic = "src-stall-slow"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	const n = 20
	var recs []*kgo.Record
	for range n {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	for _, warn := range []time.Duration{time.Second, -1} {
		tick := time.NewTicker(40 * time.Millisecond)
		h := consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
			<-tick.C // each record takes one tick: the batch of 20, most of a second
			return nil
		})
		st := &testenv.Stalls{}
		cfg := baseConfig(t, k, "g-stall-slow-"+warn.String(), topic)
		cfg.StallWarning = warn
		cfg.Hooks = []hook.Hook{st}
		r, err := consumer.New(cfg, h)
		if err != nil {
			t.Fatal(err)
		}
		stop := runAsync(t, r)
		testenv.WaitFor(t, time.Minute, "every record handled", func() bool { return r.Stats().Done == n })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		tick.Stop()
		if got := st.All(); len(got) != 0 {
			t.Fatalf("StallWarning %s: a key-shard finishing a record every 40ms reported stalled: %+v", warn, got)
		}
	}
}

// The waits between retries in place are the failure policy's choice, not
// a stall: a record retried with a backoff longer than StallWarning is
// not reported (its retries are logged already).
func TestRetryWaitIsNotAStall(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic = "src-stall-retry"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		if calls.Add(1) < 3 {
			return consumer.Retryable(errors.New("gateway 503"))
		}
		return nil
	})
	st := &testenv.Stalls{}
	cfg := baseConfig(t, k, "g-stall-retry", topic)
	cfg.StallWarning = 200 * time.Millisecond
	cfg.Failures = retrytopic.Policy{Backoff: 2 * time.Second, MaxBackoff: 2 * time.Second} // waits of 1 to 2s, each longer than StallWarning
	cfg.Hooks = []hook.Hook{st}
	r, err := consumer.New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the record done after two retries", func() bool { return r.Stats().Done == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := st.All(); len(got) != 0 {
		t.Fatalf("the waits between retries in place were reported as stalls: %+v", got)
	}
}

func TestStallWarningTooShortRefused(t *testing.T) {
	k := testenv.KafkaT(t)
	cfg := baseConfig(t, k, "g", "t")
	cfg.StallWarning = time.Millisecond
	_, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err == nil || !strings.Contains(err.Error(), "Config.StallWarning") {
		t.Fatalf("StallWarning of 1ms: New returned %v; want a ConfigError on StallWarning", err)
	}
}
