package dbscope_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// tenant is a handler whose records of one key fail, with a retryable
// error, while its dependency is down; it counts every call by value.
type tenant struct {
	key   string
	down  atomic.Bool
	mu    sync.Mutex
	calls map[string]int
}

func newTenant(key string) *tenant {
	t := &tenant{key: key, calls: map[string]int{}}
	t.down.Store(true)
	return t
}

func (tn *tenant) handle(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
	if string(r.Key) == tn.key {
		tn.mu.Lock()
		tn.calls[string(r.Value)]++
		tn.mu.Unlock()
		if tn.down.Load() {
			return consumer.Retryable(errors.New("the tenant's ledger is down"))
		}
	}
	return insertEffect(ctx, tx, r)
}

func (tn *tenant) callsOf(value string) int {
	tn.mu.Lock()
	defer tn.mu.Unlock()
	return tn.calls[value]
}

// keyBreakerRunner returns a DB-scope runner of tn with a key breaker
// whose first probe is 200ms after a key is held.
func keyBreakerRunner(t *testing.T, k *testenv.Kafka, pool *pgxpool.Pool, group, topic string, tn *tenant) *dbscope.Runner {
	t.Helper()
	cfg := baseConfig(k, group, topic)
	cfg.KeyBreaker = &consumer.KeyBreakerConfig{OpenFor: 200 * time.Millisecond}
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(tn.handle))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// wantKeyEffects fails the test unless key's effects are seqs 0..n-1, in
// order, once each.
func wantKeyEffects(t *testing.T, pool *pgxpool.Pool, key string, n int) {
	t.Helper()
	var got, want []string
	for _, e := range effectOrder(t, pool) {
		if strings.HasPrefix(e, key+"/") {
			got = append(got, e)
		}
	}
	for i := range n {
		want = append(want, fmt.Sprintf("%s/%d", key, i))
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("key %s's effects %v, want %v", key, got, want)
	}
}

// wantNothingRouted fails the test if r sent a record to a retry topic or
// the dead-letter topic.
func wantNothingRouted(t *testing.T, r *dbscope.Runner) {
	t.Helper()
	if f := r.Stats().Failures; f.RetryTopic != 0 || f.DeadLettered != 0 {
		t.Fatalf("failures %+v: want nothing sent to a retry topic or the dead-letter topic", f)
	}
}

// One key of 1,000 fails while its dependency is down: its breaker holds
// it in PostgreSQL while the other 999 keys' records are applied and their
// offsets committed, nothing going to a retry topic or the dead-letter
// topic; once the dependency is back, the key's probe succeeds and its
// records are applied once each, in order.
func TestDBKeyBreakerHoldsOneKeyOfAThousand(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group, keys, perKey = "ledger", "g-key-breaker", 1000, 3
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	tn := newTenant("k500")
	r := keyBreakerRunner(t, k, pool, group, topic, tn)
	stop := run(t, r)
	k.ProduceKeyed(t, topic, keys, perKey)
	others := int64((keys - 1) * perKey)
	testenv.WaitFor(t, 2*time.Minute, "the other 999 keys applied", func() bool { return r.Stats().DB.Applied >= others })
	testenv.WaitFor(t, time.Minute, "every offset committed while k500 is held", func() bool { return k.CommittedAll(t, group, topic) })
	testenv.WaitFor(t, time.Minute, "k500 reported held", func() bool { return r.Stats().DB.HeldKeys == 1 })
	if st := r.Stats(); st.DB.Applied != others || st.KeyBreaker.Holds < 1 {
		t.Fatalf("stats %+v, key breaker %+v: want %d applied and k500 held", st.DB, st.KeyBreaker, others)
	}
	wantNothingRouted(t, r)
	tn.down.Store(false)
	testenv.WaitFor(t, time.Minute, "k500's records applied after its probe", func() bool { return r.Stats().DB.Applied == keys*perKey })
	testenv.WaitFor(t, time.Minute, "no key held", func() bool { return r.Stats().DB.HeldKeys == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if c := countEffects(t, pool); c.rows != keys*perKey || c.unique != keys*perKey {
		t.Fatalf("effects %+v, want %d applied once each", c, keys*perKey)
	}
	wantKeyOrder(t, pool)
	wantKeyEffects(t, pool, "k500", perKey)
	wantNothingRouted(t, r)
	if n := tn.callsOf("k500/1") + tn.callsOf("k500/2"); n != 2 {
		t.Fatalf("k500's later records were called %d times, want once each (they waited in PostgreSQL)", n)
	}
}

// A probe that fails holds the key again: the held record is called once
// per probe (not retried in place), each failed probe is counted, and the
// key's records are applied in order once a probe succeeds.
func TestDBKeyBreakerFailedProbeHoldsAgain(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "ledger", "g-key-probe"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	tn := newTenant("k001")
	out := testenv.NewOutcomes()
	cfg := baseConfig(k, group, topic)
	cfg.KeyBreaker = &consumer.KeyBreakerConfig{OpenFor: 200 * time.Millisecond}
	cfg.Hooks = []hook.Hook{out}
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(tn.handle))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	k.ProduceKeyed(t, topic, 3, 2)
	testenv.WaitFor(t, time.Minute, "two probes of k001 failed", func() bool { return r.Stats().KeyBreaker.FailedProbes >= 2 })
	if err := stop(); err != nil { // no probe runs while the counts are read
		t.Fatal(err)
	}
	kb := r.Stats().KeyBreaker
	if got, want := tn.callsOf("k001/0"), 3+int(kb.Probes); got != want {
		t.Fatalf("k001/0 called %d times, want %d: 3 in place, then once per probe (%+v)", got, want, kb)
	}
	if kb.FailedProbes != kb.Probes {
		t.Fatalf("key breaker %+v: every probe so far failed", kb)
	}
	if n := tn.callsOf("k001/1"); n != 0 {
		t.Fatalf("k001/1 called %d times while its key was held", n)
	}
	// Its last delivery ended held, or aborted when the stop cut a probe
	// short.
	if o := out.Outcome("k001/0"); o != hook.OutcomeHeld && o != hook.OutcomeAborted {
		t.Fatalf("k001/0's last delivery ended %q, want held (or aborted, by the stop)", o)
	}
	tn.down.Store(false)
	r2 := keyBreakerRunner(t, k, pool, group, topic, tn)
	stop = run(t, r2)
	testenv.WaitFor(t, time.Minute, "k001's records applied", func() bool { return countEffects(t, pool).rows == 6 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantKeyEffects(t, pool, "k001", 2)
	wantNothingRouted(t, r)
	wantNothingRouted(t, r2)
}

// A runner stopped while a key is held leaves it held in PostgreSQL: the
// runner started after it on the same database probes the key at its
// stored time and applies its records once each, in order.
func TestDBKeyBreakerHoldSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "ledger", "g-key-restart"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	tn := newTenant("k002")
	r1 := keyBreakerRunner(t, k, pool, group, topic, tn)
	stop := run(t, r1)
	k.ProduceKeyed(t, topic, 5, 4)
	testenv.WaitFor(t, time.Minute, "the other keys applied", func() bool { return r1.Stats().DB.Applied >= 16 })
	testenv.WaitFor(t, time.Minute, "k002 held", func() bool { return r1.Stats().DB.HeldKeys == 1 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	tn.down.Store(false)
	r2 := keyBreakerRunner(t, k, pool, group, topic, tn)
	stop = run(t, r2)
	testenv.WaitFor(t, time.Minute, "k002's records applied by the new runner", func() bool { return r2.Stats().DB.Applied == 4 })
	testenv.WaitFor(t, time.Minute, "no key held", func() bool { return r2.Stats().DB.HeldKeys == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if p := r2.Stats().KeyBreaker.Probes; p != 1 {
		t.Fatalf("the new runner ran %d probes, want 1", p)
	}
	if c := countEffects(t, pool); c.rows != 20 || c.unique != 20 {
		t.Fatalf("effects %+v, want 20 applied once each", c)
	}
	wantKeyOrder(t, pool)
	wantKeyEffects(t, pool, "k002", 4)
	wantNothingRouted(t, r1)
	wantNothingRouted(t, r2)
}

// A batch handler's calls take the records of many keys at once: NewBatch
// refuses a key breaker at construction, with a sentence that says so.
func TestDBKeyBreakerRefusedByNewBatch(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://localhost:1/unused")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"},
		KeyBreaker: &consumer.KeyBreakerConfig{}}
	_, err = dbscope.NewBatch(cfg, dbscope.Options{Pool: pool}, dbscope.BatchHandlerFunc(
		func(context.Context, pgx.Tx, []*consumer.Record) error { return nil }))
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) || ce.Field != "KeyBreaker" || !strings.Contains(err.Error(), "use a per-record handler (dbscope.New") {
		t.Fatalf("NewBatch with a key breaker: %v; want a *consumer.ConfigError on KeyBreaker that names dbscope.New", err)
	}
	if _, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(insertEffect)); err != nil {
		t.Fatalf("New with a key breaker: %v", err)
	}
}
