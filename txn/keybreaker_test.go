package txn_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/keybreakercheck"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// In the Kafka scope, one failing key of 1,000 is held alone, in memory,
// while the other 999 flow and commit in transactions; its records are
// served once, in order, after its probe succeeds, and each output is
// written once.
func TestKeyBreakerKafka(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const out = "kbc-out"
	if err := k.CreateTopic(ctx, out, 1); err != nil {
		t.Fatal(err)
	}
	keybreakercheck.Run(t, k, "g-kafka-keybreaker", func(cfg consumer.Config, dep *keybreakercheck.Dep) (*consumer.Runner, error) {
		cfg.ClientOptions = clientOpts()
		r, err := txn.New(cfg, txn.Options{TransactionalID: "kafka-keybreaker-1"}, txn.HandlerFunc(func(_ context.Context, r *consumer.Record, em txn.Emitter) error {
			em.Emit(&kgo.Record{Topic: out, Key: r.Key, Value: r.Value})
			return dep.Call(r) // after an output: a failure drops it
		}))
		if err != nil {
			return nil, err
		}
		return r.Runner, nil
	}, keybreakercheck.Check{Held: func(t *testing.T, r *consumer.Runner) {
		if st := r.Stats().KeyBreaker; st.HeldKeys != 1 {
			t.Errorf("Stats.KeyBreaker %+v while the key is held; want 1 key", st)
		}
	}})
	seen := map[string]int{}
	for _, rec := range k.ReadAll(t, out) {
		seen[string(rec.Value)]++
	}
	want := keybreakercheck.Keys*keybreakercheck.PerKey + 4*keybreakercheck.Later
	if len(seen) != want {
		t.Errorf("%d distinct outputs read_committed; want %d", len(seen), want)
	}
	for v, n := range seen {
		if n != 1 {
			t.Errorf("output %s read_committed %d times; want once", v, n)
		}
	}
}

// The Kafka scope refuses a key breaker with a batch handler or with
// versions, with a sentence that says what to change.
func TestKeyBreakerKafkaRefused(t *testing.T) {
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}, KeyBreaker: &consumer.KeyBreakerConfig{}}
	_, err := txn.NewBatch(cfg, txn.Options{TransactionalID: "x"}, txn.BatchHandlerFunc(func(context.Context, []*consumer.Record, txn.BatchEmitter) error { return nil }))
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) || ce.Field != "KeyBreaker" || !strings.Contains(err.Error(), "use a per-record handler (txn.New)") {
		t.Errorf("NewBatch with a key breaker: %v; want a KeyBreaker error naming txn.New", err)
	}
	_, err = txn.New(cfg, txn.Options{TransactionalID: "x", Versions: &sequence.Config{}}, txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error { return nil }))
	if !errors.As(err, &ce) || ce.Field != "Versions" || !strings.Contains(err.Error(), "unset one of them") {
		t.Errorf("New with versions and a key breaker: %v; want a Versions error", err)
	}
}

// A rebalance while a key is held: a second member joins, the held
// records of the partitions that move are dropped by the first member and
// consumed again by the second, which holds the key in turn; once the
// key's dependency recovers, every input's output is read_committed once
// and each key's outputs are in order.
func TestKeyBreakerKafkaRebalance(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const in, out, group = "kbr-in", "kbr-out", "g-kbr"
	for _, topic := range []string{in, out} {
		if err := k.CreateTopic(ctx, topic, 4); err != nil {
			t.Fatal(err)
		}
	}
	var recs []*kgo.Record
	for n := range 5 {
		for key := range 40 {
			recs = append(recs, &kgo.Record{Topic: in, Key: fmt.Appendf(nil, "k%d", key), Value: fmt.Appendf(nil, "k%d-%d", key, n)})
		}
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	var attempts atomic.Int64
	h := txn.HandlerFunc(func(_ context.Context, r *consumer.Record, em txn.Emitter) error {
		em.Emit(&kgo.Record{Topic: out, Key: r.Key, Value: r.Value})
		if strings.HasPrefix(string(r.Value), "k5-") && down.Load() {
			attempts.Add(1)
			return errors.New("k5's account service is down")
		}
		return nil
	})
	member := func(id string) *txn.Runner {
		cfg := consumer.Config{Brokers: k.Brokers, Group: group, Topics: []string{in}, CommitInterval: 50 * time.Millisecond,
			DrainTimeout: 5 * time.Second, ClientOptions: clientOpts(), Failures: retrytopic.Policy{Backoff: time.Millisecond},
			KeyBreaker: &consumer.KeyBreakerConfig{OpenFor: 100 * time.Millisecond, MaxOpenFor: 200 * time.Millisecond}}
		r, err := txn.New(cfg, txn.Options{TransactionalID: id}, h)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := member("kbr-a")
	runFor(t, a)
	testenv.WaitFor(t, time.Minute, "k5 held on the first member", func() bool { return a.Stats().KeyBreaker.FailedProbes >= 1 })
	b := member("kbr-b")
	runFor(t, b)
	testenv.WaitFor(t, time.Minute, "the partitions shared", func() bool { return a.Stats().Assigned == 2 && b.Stats().Assigned == 2 })
	seen := attempts.Load()
	testenv.WaitFor(t, time.Minute, "k5 failing again after the rebalance", func() bool { return attempts.Load() > seen+1 })
	down.Store(false)
	testenv.WaitFor(t, time.Minute, "every input committed", func() bool { return k.CaughtUp(ctx, group, in) })
	got := map[string]int{}
	last := map[string]int{}
	for _, r := range k.ReadAll(t, out) {
		v := string(r.Value)
		got[v]++
		key, seq, _ := strings.Cut(v, "-")
		n, _ := strconv.Atoi(seq)
		if p, ok := last[key]; ok && n <= p {
			t.Errorf("key %s: output %s after %s-%d: per-key order broken", key, v, key, p)
		}
		last[key] = n
	}
	if len(got) != len(recs) {
		t.Errorf("%d distinct outputs read_committed; want %d", len(got), len(recs))
	}
	for v, n := range got {
		if n != 1 {
			t.Errorf("output %s read_committed %d times; want once", v, n)
		}
	}
	for _, r := range []*txn.Runner{a, b} {
		if st := r.Stats(); st.Failures.DeadLettered != 0 || st.Failures.RetryTopic != 0 {
			t.Errorf("Stats.Failures %+v; want nothing dead-lettered or sent to a retry topic", st.Failures)
		}
	}
}
