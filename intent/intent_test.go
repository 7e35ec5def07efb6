package intent_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/intent"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// provider is a payment gateway that does not deduplicate: every call
// charges, and a charge can be looked up by its idempotency key.
type provider struct {
	mu      sync.Mutex
	charges map[string]int
	calls   int
	fail    error // the next call fails with it, without charging
}

func (p *provider) charge(_ context.Context, key string) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.fail != nil {
		err := p.fail
		p.fail = nil
		return nil, err
	}
	p.charges[key]++
	return []byte("ch_" + key), nil
}

func (p *provider) lookup(_ context.Context, key string) ([]byte, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.charges[key] == 0 {
		return nil, false, nil
	}
	return []byte("ch_" + key), true, nil
}

func setup(t *testing.T) (*pgxpool.Pool, *intent.Store, *provider) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.DatabaseT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	return pool, intent.New(pool, ""), &provider{charges: map[string]int{}}
}

// attempt runs one handler attempt: Do in a transaction that commits or,
// when crash is set, never does (the process died after the call).
func attempt(t *testing.T, pool *pgxpool.Pool, s *intent.Store, p *provider, key string, crash bool) ([]byte, intent.Outcome, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // an attempt that waits on another fails
	defer cancel()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	res, out, err := s.Do(ctx, tx, key, p.charge, p.lookup)
	if err != nil || crash {
		return res, out, err
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return res, out, nil
}

// A crash between the call and the commit: the redelivery asks the
// provider, finds the charge and does not charge again.
func TestCrashAfterTheCallReconciles(t *testing.T) {
	pool, s, p := setup(t)
	if _, out, err := attempt(t, pool, s, p, "pi_1", true); err != nil || out != intent.Called {
		t.Fatalf("first attempt: %v, %v", out, err)
	}
	res, out, err := attempt(t, pool, s, p, "pi_1", false)
	if err != nil || out != intent.Reconciled || string(res) != "ch_pi_1" {
		t.Fatalf("redelivery: %q, %v, %v; want the charge, reconciled", res, out, err)
	}
	if p.charges["pi_1"] != 1 || p.calls != 1 {
		t.Fatalf("%d charges in %d calls, want 1 in 1", p.charges["pi_1"], p.calls)
	}
	// Once committed, the answer is the table's.
	res, out, err = attempt(t, pool, s, p, "pi_1", false)
	if err != nil || out != intent.Recorded || string(res) != "ch_pi_1" || p.calls != 1 {
		t.Fatalf("after the commit: %q, %v, %v, %d calls", res, out, err, p.calls)
	}
	// Two attempts reached the provider (a call, then a lookup); the one
	// that took the recorded answer did not.
	if n := attemptsOf(t, pool, "pi_1"); n != 2 {
		t.Fatalf("the intent counts %d attempts; want 2", n)
	}
}

// attemptsOf reads the attempts column of key's intent: how many attempts
// called or reconciled.
func attemptsOf(t *testing.T, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT attempts FROM kscope_intents WHERE key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A call that failed before reaching the provider: the next attempt finds
// nothing at the provider and calls; the charge is not lost.
func TestFailedCallIsMadeAgain(t *testing.T) {
	pool, s, p := setup(t)
	p.fail = errors.New("gateway: 503")
	if _, _, err := attempt(t, pool, s, p, "pi_2", false); err == nil {
		t.Fatal("the failing call returned no error")
	}
	res, out, err := attempt(t, pool, s, p, "pi_2", false)
	if err != nil || out != intent.Called || string(res) != "ch_pi_2" {
		t.Fatalf("retry: %q, %v, %v; want a call", res, out, err)
	}
	if p.charges["pi_2"] != 1 {
		t.Fatalf("%d charges, want 1", p.charges["pi_2"])
	}
	// The failed attempt's count survives its rollback.
	if n := attemptsOf(t, pool, "pi_2"); n != 2 {
		t.Fatalf("the intent counts %d attempts; want 2", n)
	}
}

// Rolled back with its record: a handler whose transaction rolls back
// after the call leaves the intent in flight, never done.
func TestRollbackLeavesTheIntentInFlight(t *testing.T) {
	pool, s, p := setup(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, _, err := s.Do(ctx, tx, "pi_3", p.charge, p.lookup); err != nil {
			return err
		}
		return errors.New("a later statement failed")
	})
	if err == nil {
		t.Fatal("want the handler's error")
	}
	var state string
	if err := pool.QueryRow(ctx, `SELECT state FROM kscope_intents WHERE key = 'pi_3'`).Scan(&state); err != nil || state != "in_flight" {
		t.Fatalf("state %q (%v), want in_flight", state, err)
	}
}

// Without a Reconcile, an intent in flight is not called again blindly.
func TestInFlightWithoutReconcileRefuses(t *testing.T) {
	pool, s, p := setup(t)
	if _, _, err := attempt(t, pool, s, p, "pi_4", true); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, _, err := s.Do(ctx, tx, "pi_4", p.charge, nil); !errors.Is(err, intent.ErrNoReconcile) {
		t.Fatalf("err %v, want ErrNoReconcile", err)
	}
	if p.calls != 1 {
		t.Fatalf("%d calls, want 1", p.calls)
	}
}

// With no pool given, the Store records intents on a pool of its own,
// opened with the settings of the handler's transaction.
func TestStoreWithoutPool(t *testing.T) {
	pool, _, p := setup(t)
	s := intent.New(nil, "")
	defer s.Close()
	if _, _, err := attempt(t, pool, s, p, "pi_5", true); err != nil {
		t.Fatal(err)
	}
	if _, out, err := attempt(t, pool, s, p, "pi_5", false); err != nil || out != intent.Reconciled || p.calls != 1 {
		t.Fatalf("%v, %v, %d calls", out, err, p.calls)
	}
}

// A Store without a pool opens its own with the handler connection's
// settings as they are, including those set in code and absent from the
// connection string: here the search_path of the schema the intents table
// is in.
func TestStoreWithoutPoolKeepsSettingsMadeInCode(t *testing.T) {
	ctx := context.Background()
	url := testenv.DatabaseT(t)
	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, `CREATE SCHEMA tenant_a`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = "tenant_a"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	s := intent.New(nil, "")
	defer s.Close()
	p := &provider{charges: map[string]int{}}
	if _, out, err := attempt(t, pool, s, p, "pi_9", false); err != nil || out != intent.Called || p.calls != 1 {
		t.Fatalf("%v, %v, %d calls: want the call made once, its intent recorded in tenant_a", out, err, p.calls)
	}
}

// One Store serves handlers on two databases: each intent is recorded in
// the database of its handler's transaction; a Store given the pool of
// another database refuses to mark an intent it cannot see.
func TestStoreOnTwoDatabases(t *testing.T) {
	poolA, _, p := setup(t)
	poolB, _, _ := setup(t)
	s := intent.New(nil, "")
	defer s.Close()
	for _, pool := range []*pgxpool.Pool{poolA, poolB} {
		if _, out, err := attempt(t, pool, s, p, "pi_6", false); err != nil || (out != intent.Called && out != intent.Reconciled) {
			t.Fatalf("%v, %v", out, err)
		}
		var state string
		if err := pool.QueryRow(context.Background(), `SELECT state FROM kscope_intents WHERE key = 'pi_6'`).Scan(&state); err != nil || state != "done" {
			t.Fatalf("state %q (%v) in the handler's database, want done", state, err)
		}
	}
	wrong := intent.New(poolA, "")
	ctx := context.Background()
	tx, err := poolB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, _, err := wrong.Do(ctx, tx, "pi_7", p.charge, p.lookup); err == nil || !strings.Contains(err.Error(), "not in the database of the handler's transaction") {
		t.Fatalf("err %v, want a refusal", err)
	}
}

// Two attempts of one key at once — two records of one payment on
// different shards, or a partition's old owner still calling after a
// rebalance gave its records to a new one: while the first is calling the
// provider, the second neither calls nor asks the provider (which has no
// answer yet); it fails with ErrBusy. Retried once the first committed, it
// takes the recorded answer.
func TestConcurrentAttemptCallsNothing(t *testing.T) {
	pool, s, p := setup(t)
	ctx := context.Background()
	entered, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, _, err := s.Do(ctx, tx, "pi_8", func(ctx context.Context, key string) ([]byte, error) {
				close(entered)
				<-release // the provider is slow to answer
				return p.charge(ctx, key)
			}, p.lookup)
			return err
		})
	}()
	<-entered
	_, _, err := attempt(t, pool, s, p, "pi_8", false)
	close(release)
	if ferr := <-first; ferr != nil {
		t.Fatalf("first attempt: %v", ferr)
	}
	if !errors.Is(err, intent.ErrBusy) || retrytopic.ClassOf(err) != consumer.ClassRetryable {
		t.Errorf("second attempt while the first was calling: err %v (class %s), want ErrBusy, retryable", err, retrytopic.ClassOf(err))
	}
	if p.charges["pi_8"] != 1 {
		t.Fatalf("%d charges, want 1", p.charges["pi_8"])
	}
	res, out, err := attempt(t, pool, s, p, "pi_8", false)
	if err != nil || out != intent.Recorded || string(res) != "ch_pi_8" || p.calls != 1 {
		t.Fatalf("second attempt retried: %q, %v, %v, %d calls; want the recorded charge", res, out, err, p.calls)
	}
}

// While an attempt holds the key, a concurrent one is refused until its
// transaction ends; when that transaction rolled back, the next attempt
// reconciles instead of charging again.
func TestConcurrentAttemptAfterRollbackReconciles(t *testing.T) {
	pool, s, p := setup(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, out, err := s.Do(ctx, tx, "pi_9", p.charge, p.lookup); err != nil || out != intent.Called {
		t.Fatalf("first attempt: %v, %v", out, err)
	}
	// The handler has not returned: its transaction still holds the key.
	if _, _, err := attempt(t, pool, s, p, "pi_9", false); !errors.Is(err, intent.ErrBusy) {
		t.Fatalf("attempt during the first's transaction: err %v, want ErrBusy", err)
	}
	if err := tx.Rollback(ctx); err != nil { // a later statement of its handler failed
		t.Fatal(err)
	}
	res, out, err := attempt(t, pool, s, p, "pi_9", false)
	if err != nil || out != intent.Reconciled || string(res) != "ch_pi_9" {
		t.Fatalf("after the rollback: %q, %v, %v; want the charge, reconciled", res, out, err)
	}
	if p.charges["pi_9"] != 1 || p.calls != 1 {
		t.Fatalf("%d charges in %d calls, want 1 in 1", p.charges["pi_9"], p.calls)
	}
}

// A second Do of a key in the transaction that already called for it (two
// records of one payment in one DB-scope batch) takes the first's answer
// at once: it neither waits for its own transaction nor calls again.
func TestSecondDoInOneTransaction(t *testing.T) {
	pool, s, p := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	if _, out, err := s.Do(ctx, tx, "pi_10", p.charge, p.lookup); err != nil || out != intent.Called {
		t.Fatalf("first Do: %v, %v", out, err)
	}
	res, out, err := s.Do(ctx, tx, "pi_10", p.charge, p.lookup)
	if err != nil || out != intent.Recorded || string(res) != "ch_pi_10" {
		t.Fatalf("second Do in the same transaction: %q, %v, %v; want the first's answer, recorded", res, out, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if p.calls != 1 {
		t.Fatalf("%d calls, want 1", p.calls)
	}
}
