package dbscope_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// errTenantDown is the failure the key breakers of these tests count
// (KeyBreakerConfig.Trips); any other failure follows the failure policy.
var errTenantDown = errors.New("the tenant's ledger is down")

// A record in the retry topics, its key's head with records waiting
// behind it in PostgreSQL, fails on its hop in a way the key breaker
// counts: it is held, stored ahead of the records that waited behind it,
// and after its probe the key's records are applied in order.
func TestDBKeyBreakerHoldsARetryTopicHead(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "ledger", "g-key-head"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Failures = orderedPolicy(2, 10)
	cfg.KeyBreaker = &consumer.KeyBreakerConfig{Failures: 1, OpenFor: 200 * time.Millisecond,
		Trips: func(err error) bool { return errors.Is(err, errTenantDown) }}
	var calls atomic.Int32
	var down atomic.Bool
	down.Store(true)
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if string(r.Value) == "k/0" {
				switch n := calls.Add(1); {
				case n == 1:
					return consumer.Retryable(errors.New("a timeout")) // not counted: to the retry topics
				case down.Load():
					return consumer.Retryable(errTenantDown)
				}
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	headInRetryTopic(t, k, r, topic) // k/0
	if err := k.Produce(ctx, idRecord(topic, "k", "k/1", "B"), idRecord(topic, "k", "k/2", "C")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "k held on k/0's hop", func() bool { return r.Stats().KeyBreaker.Holds >= 1 })
	testenv.WaitFor(t, time.Minute, "k/1 and k/2 waiting", func() bool { return r.Stats().DB.Parked >= 2 })
	down.Store(false)
	testenv.WaitFor(t, time.Minute, "k's records applied", func() bool { return r.Stats().DB.Applied == 3 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantKeyEffects(t, pool, "k", 3)
	if f := r.Stats().Failures; f.RetryTopic != 1 || f.DeadLettered != 0 {
		t.Fatalf("failures %+v: want k/0's one hop through a retry topic, nothing dead-lettered", f)
	}
}

// The probe succeeds, and the record behind it fails until the key
// breaker holds the key again during the same release: that record
// becomes the key's held head, the records behind it keep waiting, and
// after its own probe the rest are applied in order.
func TestDBKeyBreakerRecordBehindTheProbeHoldsAgain(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "ledger", "g-key-behind"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.KeyBreaker = &consumer.KeyBreakerConfig{OpenFor: 200 * time.Millisecond,
		Trips: func(err error) bool { return errors.Is(err, errTenantDown) }}
	var mu sync.Mutex
	calls := map[string]int{}
	var down0, down1 atomic.Bool
	down0.Store(true)
	down1.Store(true)
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			mu.Lock()
			calls[string(r.Value)]++
			mu.Unlock()
			if v := string(r.Value); (v == "k/0" && down0.Load()) || (v == "k/1" && down1.Load()) {
				return consumer.Retryable(errTenantDown)
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	for i, v := range []string{"k/0", "k/1", "k/2"} {
		if err := k.Produce(ctx, idRecord(topic, "k", v, v)); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			testenv.WaitFor(t, time.Minute, "k held on k/0", func() bool { return r.Stats().KeyBreaker.Holds >= 1 })
		}
	}
	testenv.WaitFor(t, time.Minute, "k/1 and k/2 waiting", func() bool { return r.Stats().DB.Parked >= 2 })
	down0.Store(false)
	testenv.WaitFor(t, time.Minute, "k/0 applied and k held again on k/1", func() bool {
		return r.Stats().DB.Applied == 1 && r.Stats().KeyBreaker.Holds >= 2
	})
	mu.Lock()
	c1, c2 := calls["k/1"], calls["k/2"]
	mu.Unlock()
	if c1 != 3 || c2 != 0 {
		t.Fatalf("k/1 called %d times, k/2 %d: want k/1's 3 attempts in place, which held the key, and k/2 waiting", c1, c2)
	}
	down1.Store(false)
	testenv.WaitFor(t, time.Minute, "k's records applied", func() bool { return r.Stats().DB.Applied == 3 })
	testenv.WaitFor(t, time.Minute, "no key held", func() bool { return r.Stats().DB.HeldKeys == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantKeyEffects(t, pool, "k", 3)
	wantNothingRouted(t, r)
}

// A runner stopped while its probe's handler runs rolls the probe's
// transaction back: the key stays held in PostgreSQL, and the next runner
// probes it again and applies its records once each, in order.
func TestDBKeyBreakerStopDuringProbe(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "ledger", "g-key-stop-probe"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	tn := newTenant("k003")
	var block atomic.Bool
	entered := make(chan struct{}, 1)
	newRunner := func() *dbscope.Runner {
		cfg := baseConfig(k, group, topic)
		cfg.KeyBreaker = &consumer.KeyBreakerConfig{OpenFor: 200 * time.Millisecond}
		r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
			func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
				if string(r.Value) == "k003/0" && block.Load() {
					select {
					case entered <- struct{}{}:
					default:
					}
					<-ctx.Done() // the probe runs until its runner stops
					return ctx.Err()
				}
				return tn.handle(ctx, tx, r)
			}))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r1 := newRunner()
	stop := run(t, r1)
	k.ProduceKeyed(t, topic, 5, 3)
	testenv.WaitFor(t, time.Minute, "the other keys applied", func() bool { return r1.Stats().DB.Applied >= 12 })
	testenv.WaitFor(t, time.Minute, "k003 held", func() bool { return r1.Stats().DB.HeldKeys == 1 })
	block.Store(true)
	tn.down.Store(false)
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("k003's probe did not run")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	block.Store(false)
	r2 := newRunner()
	stop = run(t, r2)
	testenv.WaitFor(t, time.Minute, "k003's records applied by the next runner", func() bool { return r2.Stats().DB.Applied == 3 })
	testenv.WaitFor(t, time.Minute, "no key held", func() bool { return r2.Stats().DB.HeldKeys == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if c := countEffects(t, pool); c.rows != 15 || c.unique != 15 {
		t.Fatalf("effects %+v, want 15 applied once each", c)
	}
	wantKeyOrder(t, pool)
	wantKeyEffects(t, pool, "k003", 3)
}
