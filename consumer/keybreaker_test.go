package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/keybreakercheck"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// In the AtLeastOnce scope, one failing key of 1,000 is held alone, in
// memory, while the other 999 flow; its records are served once, in
// order, after its probe succeeds.
func TestKeyBreakerAtLeastOnce(t *testing.T) {
	k := testenv.KafkaT(t)
	keybreakercheck.Run(t, k, "g-keybreaker", func(cfg consumer.Config, dep *keybreakercheck.Dep) (*consumer.Runner, error) {
		return consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error { return dep.Call(r) }))
	}, keybreakercheck.Check{Held: func(t *testing.T, r *consumer.Runner) {
		st := r.Stats().KeyBreaker
		if st.HeldKeys != 1 || st.HeldRecords != keybreakercheck.PerKey+keybreakercheck.Later {
			t.Errorf("Stats.KeyBreaker %+v while the key is held; want 1 key holding %d records", st, keybreakercheck.PerKey+keybreakercheck.Later)
		}
	}})
}

// A runner stopped while a key is held stops at once (a held record is
// not a running one), commits nothing past the held record, and the next
// runner serves the key's records once, in order.
func TestKeyBreakerStopWhileHeld(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "kb-stop", "g-kb-stop"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 6 {
		key := "ok"
		if i%2 == 0 {
			key = "bad"
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: fmt.Appendf(nil, "%s-%d", key, i)})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	var served []string
	h := consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error {
		if string(r.Key) == "bad" && down.Load() {
			return errDown
		}
		mu.Lock()
		served = append(served, string(r.Value))
		mu.Unlock()
		return nil
	})
	cfg := baseConfig(t, k, group, topic)
	cfg.DrainTimeout = 40 * time.Second
	cfg.Failures.Backoff = time.Millisecond
	cfg.KeyBreaker = &consumer.KeyBreakerConfig{OpenFor: time.Hour}
	r, err := consumer.New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the bad key held, the ok key served", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(served) == 3 && r.Stats().KeyBreaker.HeldRecords == 3
	})
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Run took %s to stop with a key held; want no wait for held records (DrainTimeout is %s)", d, cfg.DrainTimeout)
	}
	com, err := k.CommittedOffsets(ctx, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	if com[0] > 0 {
		t.Errorf("offset %d committed with the record at 0 held; want nothing committed past it", com[0])
	}

	down.Store(false)
	mu.Lock()
	served = nil
	mu.Unlock()
	r2, err := consumer.New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r2)
	testenv.WaitFor(t, time.Minute, "every record served and committed", func() bool { return k.CaughtUp(ctx, group, topic) })
	mu.Lock()
	defer mu.Unlock()
	var bad []string
	for _, v := range served {
		if strings.HasPrefix(v, "bad-") {
			bad = append(bad, v)
		}
	}
	if !slices.Equal(bad, []string{"bad-0", "bad-2", "bad-4"}) {
		t.Errorf("the held key's records served as %v after the restart; want bad-0, bad-2, bad-4", bad)
	}
}

// A failure the breaker does not count (by default a terminal one: the
// record's own) follows the failure policy: the record goes to the
// dead-letter topic and its key is not held.
func TestKeyBreakerTerminalNotHeld(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "kb-terminal", "g-kb-terminal"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("poison")}, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("fine")}); err != nil {
		t.Fatal(err)
	}
	var fine atomic.Int64
	cfg := baseConfig(t, k, group, topic)
	cfg.KeyBreaker = &consumer.KeyBreakerConfig{Failures: 1}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error {
		if string(r.Value) == "poison" {
			return consumer.Terminal(errors.New("unparseable"))
		}
		fine.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "both records done", func() bool { return fine.Load() == 1 && k.CaughtUp(ctx, group, topic) })
	if st := r.Stats(); st.KeyBreaker.Holds != 0 || st.Failures.DeadLettered != 1 {
		t.Errorf("Stats.KeyBreaker %+v, dead letters %d; want no hold and the poison record dead-lettered", st.KeyBreaker, st.Failures.DeadLettered)
	}
}

// Bad key-breaker settings, and a key breaker with a batch handler, fail
// New with a sentence naming the field and what to change.
func TestKeyBreakerConfigErrors(t *testing.T) {
	nop := consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil })
	cases := []struct {
		name  string
		kb    consumer.KeyBreakerConfig
		field string
		says  string
	}{
		{"negative failures", consumer.KeyBreakerConfig{Failures: -1}, "KeyBreaker.Failures", "0 selects 3"},
		{"negative window", consumer.KeyBreakerConfig{Window: -time.Second}, "KeyBreaker.Window", "positive duration"},
		{"negative open-for", consumer.KeyBreakerConfig{OpenFor: -time.Second}, "KeyBreaker.OpenFor", "positive duration"},
		{"max below open-for", consumer.KeyBreakerConfig{OpenFor: time.Minute, MaxOpenFor: time.Second}, "KeyBreaker.MaxOpenFor", "at least OpenFor"},
		{"negative max keys", consumer.KeyBreakerConfig{MaxKeys: -1}, "KeyBreaker.MaxKeys", "positive count"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}, KeyBreaker: &tc.kb}
			_, err := consumer.New(cfg, nop)
			var ce *consumer.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %v; want field %s saying %q", err, tc.field, tc.says)
			}
		})
	}
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}, KeyBreaker: &consumer.KeyBreakerConfig{}}
	_, err := consumer.NewBatch(cfg, consumer.BatchHandlerFunc(func(context.Context, []*consumer.Record) error { return nil }))
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) || ce.Field != "KeyBreaker" || !strings.Contains(err.Error(), "use a per-record handler") {
		t.Errorf("NewBatch with a key breaker: %v; want a KeyBreaker error", err)
	}
	_, err = consumer.NewScoped(cfg, plainScope{})
	if !errors.As(err, &ce) || ce.Field != "KeyBreaker" || !strings.Contains(err.Error(), "scope.KeyHolder") {
		t.Errorf("NewScoped of a scope that cannot hold keys: %v; want a KeyBreaker error", err)
	}
}

// plainScope is a scope of a service's own that cannot hold keys.
type plainScope struct{}

func (plainScope) Process(_ context.Context, batch []*consumer.Record, done func(*consumer.Record)) {
	for _, r := range batch {
		done(r)
	}
}
