package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// A held key's records count against MaxInFlightRecords: a key held with
// a backlog larger than the bound fills the room (the runner polls while
// half of it is free) and the runner stops fetching, in-flight records
// never above the bound, rather than growing;
// the other keys fetched with it flow and are served meanwhile; once the
// key's probe succeeds its records are served in order, each once, and
// the rest of the topic follows.
func TestKeyBreakerHeldRecordsCountAgainstInFlight(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "kb-bound", "g-kb-bound"
	const limit, bad, others = 50, 120, 40
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	// bad-0, half the other keys' records, the rest of the held key's
	// backlog (more than the bound), the other half.
	var recs []*kgo.Record
	add := func(key, value string) {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value)})
	}
	add("bad", "bad-0")
	for i := range others / 2 {
		add(fmt.Sprintf("o%d", i), fmt.Sprintf("ok-%d", i))
	}
	for i := 1; i < bad; i++ {
		add("bad", fmt.Sprintf("bad-%d", i))
	}
	for i := others / 2; i < others; i++ {
		add(fmt.Sprintf("o%d", i), fmt.Sprintf("ok-%d", i))
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	var badServed []string
	var okServed atomic.Int64
	cfg := baseConfig(t, k, group, topic)
	cfg.MaxInFlightRecords = limit
	cfg.Shards = 8
	cfg.Failures.Backoff = time.Millisecond
	cfg.KeyBreaker = &consumer.KeyBreakerConfig{OpenFor: 500 * time.Millisecond, MaxOpenFor: time.Second}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, rec *consumer.Record) error {
		if string(rec.Key) != "bad" {
			okServed.Add(1)
			return nil
		}
		if down.Load() {
			return errDown
		}
		mu.Lock()
		badServed = append(badServed, string(rec.Value))
		mu.Unlock()
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	// The runner polls while half the bound is free: held records past
	// half of it leave no room to poll.
	testenv.WaitFor(t, time.Minute, "the held key's records filling the room", func() bool {
		st := r.Stats()
		return st.KeyBreaker.HeldKeys == 1 && st.InFlight > limit/2 && int64(st.KeyBreaker.HeldRecords) == st.InFlight
	})
	if n := okServed.Load(); n < others/2 {
		t.Errorf("%d records of the other keys served while the key was held; want the %d fetched with it", n, others/2)
	}
	// Sample a while: the runner does not fetch past the bound.
	polled := r.Stats().Polled
	for range 20 {
		if st := r.Stats(); st.InFlight > limit || st.Polled != polled {
			t.Fatalf("InFlight %d, Polled %d (was %d) with the held key filling the room; want no fetch past the bound of %d", st.InFlight, st.Polled, polled, limit)
		}
		time.Sleep(50 * time.Millisecond) // sampling, not synchronisation
	}
	down.Store(false)
	testenv.WaitFor(t, time.Minute, "every record served and committed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(badServed) == bad && okServed.Load() == others && k.CaughtUp(ctx, group, topic)
	})
	want := make([]string, bad)
	for i := range want {
		want[i] = fmt.Sprintf("bad-%d", i)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(badServed, want) {
		t.Errorf("the held key's records served as %s; want bad-0 to bad-%d, in order, once each", strings.Join(badServed, ","), bad-1)
	}
	st := r.Stats()
	if st.MaxInFlight > limit {
		t.Errorf("Stats.MaxInFlight %d; want at most MaxInFlightRecords (%d)", st.MaxInFlight, limit)
	}
	if st.KeyBreaker.HeldKeys != 0 || st.KeyBreaker.Probes == 0 || st.Failures.DeadLettered != 0 || st.Failures.RetryTopic != 0 {
		t.Errorf("Stats.KeyBreaker %+v, Failures %+v; want the key released after a probe, nothing routed", st.KeyBreaker, st.Failures)
	}
}
