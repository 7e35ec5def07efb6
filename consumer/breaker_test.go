package consumer_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/breakercheck"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// In the AtLeastOnce scope, a dependency's breaker opens after its
// failures, pauses fetching, routes nothing while open, probes, closes
// when the dependency recovers, and every record is served once in key
// order.
func TestBreakerAtLeastOnce(t *testing.T) {
	k := testenv.KafkaT(t)
	breakercheck.Run(t, k, "g-breaker", func(cfg consumer.Config, dep *breakercheck.Dep) (*consumer.Runner, error) {
		return consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error { return dep.Call(r) }))
	})
}

// A breaker without a name or a Trips, named twice, or with a negative
// count or duration fails New with a sentence naming the field.
func TestBreakerConfigErrors(t *testing.T) {
	trips := func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }
	nop := consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil })
	cases := []struct {
		name     string
		breakers []consumer.BreakerConfig
		field    string
		says     string
	}{
		{"no name", []consumer.BreakerConfig{{Trips: trips}}, "Breakers[0].Name", "name the breaker's dependency"},
		{"same name", []consumer.BreakerConfig{{Name: "db", Trips: trips}, {Name: "db", Trips: trips}}, "Breakers[1].Name", "give each breaker its own name"},
		{"no trips", []consumer.BreakerConfig{{Name: "db"}}, "Breakers[0].Trips", "reports whether a handler error is a failure of the dependency"},
		{"negative failures", []consumer.BreakerConfig{{Name: "db", Trips: trips, Failures: -1}}, "Breakers[0].Failures", "0 selects 3"},
		{"negative window", []consumer.BreakerConfig{{Name: "db", Trips: trips, Window: -time.Second}}, "Breakers[0].Window", "positive duration"},
		{"negative open-for", []consumer.BreakerConfig{{Name: "db", Trips: trips, OpenFor: -time.Second}}, "Breakers[0].OpenFor", "positive duration"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}, Breakers: tc.breakers}
			r, err := consumer.New(cfg, nop)
			if err == nil {
				r.Close()
				t.Fatal("New accepted a bad breaker")
			}
			var ce *consumer.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %q; want field %s saying %q", err, tc.field, tc.says)
			}
		})
	}
	r, err := consumer.New(consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"},
		Breakers: []consumer.BreakerConfig{{Name: "db", Trips: trips}}}, nop)
	if err != nil {
		t.Fatalf("a breaker with its defaults: %v", err)
	}
	defer r.Close()
	if st := r.Stats().Breakers; len(st) != 0 && (st[0].Name != "db" || st[0].State != consumer.BreakerClosed) {
		t.Errorf("Stats.Breakers %+v before Run; want db closed, or none yet", st)
	}
}

// A record failing alone opens a breaker whose Failures is the in-place
// attempts (the defaults: 3 and 3) on its last attempt in place: it waits
// instead of going to the dead-letter topic, and is handled once the
// dependency recovers.
func TestBreakerOpensOnARecordFailingAlone(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "brk-alone", "g-brk-alone"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	var handled atomic.Int64
	down.Store(true)
	cfg := baseConfig(t, k, group, topic)
	cfg.Failures.Backoff = time.Millisecond
	cfg.Breakers = []consumer.BreakerConfig{{Name: "dep", Trips: func(err error) bool { return errors.Is(err, errDown) }, OpenFor: 100 * time.Millisecond}}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		if down.Load() {
			return errDown
		}
		handled.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the breaker open", func() bool {
		bs := r.Stats().Breakers
		return len(bs) == 1 && bs[0].Trips >= 2
	})
	down.Store(false)
	testenv.WaitFor(t, time.Minute, "the record handled and committed", func() bool { return handled.Load() == 1 && k.CaughtUp(ctx, group, topic) })
	if f := r.Stats().Failures; f.DeadLettered != 0 || f.Retries != 2 {
		t.Errorf("Stats.Failures %+v; want no dead letter, the 2 retries in place before the breaker opened", f)
	}
	if ends, err := k.EndOffsets(ctx, retrytopic.DLTopic(group)); err == nil && ends[0] != 0 {
		t.Errorf("the dead-letter topic holds %d records; want none", ends[0])
	}
}

// A revoke does not wait for the records that wait at an open breaker
// (their calls have not started): a member that joins while the breaker
// is open gets its partitions well within DrainTimeout.
func TestBreakerRevokeDoesNotWaitForWaitingRecords(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "brk-revoke", "g-brk-revoke"
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 40 {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte{byte('a' + i%20)}, Value: []byte("v")})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	member := func() *consumer.Runner {
		cfg := baseConfig(t, k, group, topic)
		cfg.DrainTimeout = 40 * time.Second
		cfg.Failures.Backoff = time.Millisecond
		cfg.Breakers = []consumer.BreakerConfig{{Name: "dep", Trips: func(err error) bool { return errors.Is(err, errDown) }, OpenFor: time.Hour}}
		r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
			if down.Load() {
				return errDown
			}
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		runAsync(t, r)
		return r
	}
	a := member()
	testenv.WaitFor(t, time.Minute, "the breaker open", func() bool {
		bs := a.Stats().Breakers
		return len(bs) == 1 && bs[0].State == consumer.BreakerOpen
	})
	start := time.Now()
	b := member()
	testenv.WaitFor(t, time.Minute, "the partitions shared", func() bool { return a.Stats().Assigned == 2 && b.Stats().Assigned == 2 })
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the rebalance took %s with records waiting at the open breaker; want no wait for them (DrainTimeout is 40s)", d)
	}
}
