package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/ratecheck"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// A rate limit of 200 records a second holds within 5% on a backlog, with
// the handler called by 16 key-shards: the waits sleep, so the process's
// CPU stays under its bound while limited, and they are not stalls. Over
// 20 s under 5% of one core on Apache Kafka (make test-kafka); over 3 s
// under 20% on kfake under the race detector (internal/ratecheck).
func TestRateLimitHoldsWithoutSpinning(t *testing.T) {
	k := testenv.KafkaT(t)
	ratecheck.Run(t, k, baseConfig(t, k, "g-rate"), func(cfg consumer.Config, handled func()) (*consumer.Runner, error) {
		return consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
			handled()
			return nil
		}))
	})
}

// A per-key limit paces each key on its own: one key's records wait for
// their turns while the other keys' go on.
func TestRateLimitPerKey(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "rate-key", "g-rate-key"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 10 {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("slow"), Value: fmt.Appendf(nil, "slow-%d", i)})
	}
	for i := range 50 {
		recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "fast-%d", i)})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var slow atomic.Int64
	var firstSlow, lastSlow atomic.Int64
	cfg := baseConfig(t, k, group, topic)
	cfg.Shards = 64
	cfg.RateLimit = consumer.RateLimit{PerKey: consumer.Rate{PerSecond: 20}}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, rec *consumer.Record) error {
		if string(rec.Key) == "slow" {
			now := time.Now().UnixNano()
			firstSlow.CompareAndSwap(0, now)
			lastSlow.Store(now)
			slow.Add(1)
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == int64(len(recs)) })
	// 10 records of one key at 20 a second: 9 gaps of 50ms.
	if took := time.Duration(lastSlow.Load() - firstSlow.Load()); took < 400*time.Millisecond {
		t.Errorf("one key's 10 records took %s; want at least 450ms at 20 a second", took)
	}
	if st := r.Stats().RateLimit; st.Keys != 51 {
		t.Errorf("Stats.RateLimit.Keys %d; want the 51 keys seen", st.Keys)
	}
}

// A RateLimit that cannot work fails at construction, saying what to
// change.
func TestRateLimitConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		l    consumer.RateLimit
		want string
	}{
		{consumer.RateLimit{Records: consumer.Rate{PerSecond: -1}}, "RateLimit.Records.PerSecond"},
		{consumer.RateLimit{Records: consumer.Rate{PerSecond: math.Inf(1)}}, "RateLimit.Records.PerSecond"},
		{consumer.RateLimit{Bytes: consumer.Rate{Burst: 10}}, "RateLimit.Bytes.Burst: is set without PerSecond"},
		{consumer.RateLimit{PerTopic: map[string]consumer.Rate{"a": {}}}, "RateLimit.PerTopic[a]: has no PerSecond"},
		{consumer.RateLimit{Keys: 10}, "RateLimit.Keys: is set without RateLimit.PerKey"},
	} {
		_, err := consumer.New(consumer.Config{Brokers: []string{"localhost:1"}, Group: "g", Topics: []string{"a"}, RateLimit: tc.l},
			consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
		var ce *consumer.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("RateLimit %+v: error %v; want a ConfigError naming %q", tc.l, err, tc.want)
		}
	}
}

// A bytes limit holds on records flowing: records of 1,003 bytes (key and
// value) limited to 100,300 bytes a second are handled at 100,300 bytes a
// second within 5%, once the bucket's first second's worth (its default
// burst) is spent. Over the 3 s window that is 300 records, so one record
// more or less at either end of the window is 0.7%; the 5% is the
// records test's bound.
func TestRateLimitBytes(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "rate-bytes", "g-rate-bytes"
	const size, perSecond = 1003, 100 * 1003.0
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	value := make([]byte, size-3)
	recs := make([]*kgo.Record, 1200)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%02d", i%50), Value: value}
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var bytes, calls atomic.Int64
	cfg := baseConfig(t, k, group, topic)
	cfg.RateLimit = consumer.RateLimit{Bytes: consumer.Rate{PerSecond: perSecond}}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, rec *consumer.Record) error {
		bytes.Add(int64(len(rec.Key) + len(rec.Value)))
		calls.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	// Past the burst (100 records), with records fetched ahead.
	testenv.WaitFor(t, time.Minute, "the burst spent", func() bool {
		n := calls.Load()
		return n >= 150 && r.Stats().Polled >= n+100
	})
	s := ratecheck.Measure(t, 3*time.Second, bytes.Load, nil)
	t.Logf("%d bytes in %s: %.0f a second (limit %.0f); CPU %.2f%% of one core", s.Count, s.Elapsed.Round(time.Millisecond), s.Rate, perSecond, s.CPU*100)
	ratecheck.Within(t, "the bytes handled", s.Rate, perSecond, ratecheck.Tolerance)
	ratecheck.UnderCPUBound(t, s)
}

// A topic's limit holds on that topic alone: with another topic, without
// a limit, consumed too, the limited topic's records are handled at 50 a
// second within 5% (150 records over the 3 s window: one record at either
// end is 0.7%), and the other's are all handled. (A topic's wait holds its
// key-shard, so the other topic's records queued behind it on that
// key-shard wait too: RateLimit.PerTopic.)
func TestRateLimitPerTopic(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const slow, other, group = "rate-topic-slow", "rate-topic-other", "g-rate-topic"
	const perSecond = 50.0
	var recs []*kgo.Record
	for _, topic := range []string{slow, other} {
		if err := k.CreateTopic(ctx, topic, 2); err != nil {
			t.Fatal(err)
		}
		for i := range 400 {
			recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%40), Value: fmt.Appendf(nil, "v%d", i)})
		}
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var slowN, otherN atomic.Int64
	cfg := baseConfig(t, k, group, slow, other)
	cfg.RateLimit = consumer.RateLimit{PerTopic: map[string]consumer.Rate{slow: {PerSecond: perSecond}}}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, rec *consumer.Record) error {
		if rec.Topic == slow {
			slowN.Add(1)
		} else {
			otherN.Add(1)
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the limited topic flowing", func() bool { return slowN.Load() >= 10 })
	s := ratecheck.Measure(t, 3*time.Second, slowN.Load, nil)
	t.Logf("limited topic: %d records in %s: %.1f a second (limit %.0f); CPU %.2f%% of one core", s.Count, s.Elapsed.Round(time.Millisecond), s.Rate, perSecond, s.CPU*100)
	ratecheck.Within(t, "the limited topic", s.Rate, perSecond, ratecheck.Tolerance)
	ratecheck.UnderCPUBound(t, s)
	testenv.WaitFor(t, time.Minute, "every record handled", func() bool { return slowN.Load() == 400 && otherN.Load() == 400 })
}
