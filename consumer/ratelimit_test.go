package consumer_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

var longRate = flag.Bool("kscope.long-rate", false, "run the rate limit test over 20 s instead of 3 s")

// cpuTime returns the process's user and system CPU time so far.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A rate limit of 200 records a second holds within 5% over the window
// (3 s; 20 s with -kscope.long-rate) on a backlog, with the handler
// called by 16 key-shards: the waits sleep, so the process's CPU stays
// under 5% of one core while limited, and they are not stalls.
func TestRateLimitHoldsWithoutSpinning(t *testing.T) {
	ctx := context.Background()
	window := 3 * time.Second
	if *longRate {
		window = 20 * time.Second
	}
	const perSecond = 200.0
	k := testenv.KafkaT(t)
	const topic, group = "rate", "g-rate"
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	backlog := int(perSecond*window.Seconds()) + 2000
	recs := make([]*kgo.Record, backlog)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%97), Value: fmt.Appendf(nil, "v%d", i)}
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	cfg := baseConfig(t, k, group, topic)
	cfg.RateLimit = consumer.RateLimit{Records: consumer.Rate{PerSecond: perSecond}}
	cfg.StallWarning = 100 * time.Millisecond // a wait reported as a stall would show in Stats
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		handled.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	// Measure once the runner has fetched a backlog and runs limited.
	testenv.WaitFor(t, time.Minute, "the backlog fetched", func() bool { return handled.Load() >= 50 && r.Stats().InFlight >= 100 })
	n0, c0, t0 := handled.Load(), cpuTime(t), time.Now()
	stalled := 0
	for time.Since(t0) < window {
		stalled = max(stalled, r.Stats().StalledShards)
		time.Sleep(50 * time.Millisecond) // sampling Stats, not synchronisation
	}
	n1, c1, elapsed := handled.Load(), cpuTime(t), time.Since(t0)
	rate := float64(n1-n0) / elapsed.Seconds()
	cpu := float64(c1-c0) / float64(elapsed)
	t.Logf("%.1f records/s over %s (limit %.0f); CPU %.2f%% of one core; Stats.RateLimit %+v", rate, elapsed.Round(time.Millisecond), perSecond, cpu*100, r.Stats().RateLimit)
	if math.Abs(rate-perSecond)/perSecond > 0.05 {
		t.Errorf("%.1f records a second; want %.0f within 5%%", rate, perSecond)
	}
	// Under 5% of one core; the race detector's instrumentation (make
	// test) multiplies a process's CPU several times, so there the bound
	// is 20%, still far under the whole core a busy loop takes.
	bound := 0.05
	if raceDetector {
		bound = 0.20
	}
	if cpu > bound {
		t.Errorf("the process used %.2f%% of one core while limited; want under %.0f%% (no busy loop)", cpu*100, bound*100)
	}
	if stalled > 0 {
		t.Errorf("Stats.StalledShards reached %d; a rate limit's wait is not a stall", stalled)
	}
	if st := r.Stats().RateLimit; st.Waits == 0 || st.Waited <= 0 {
		t.Errorf("Stats.RateLimit %+v; want the waits counted", st)
	}
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
