package dbscope_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/internal/testmain"
	"github.com/kscope-dev/kscope/retrytopic"
)

func TestMain(m *testing.M) {
	testmain.Main(m)
}

// newPool returns a pool on a fresh, migrated database with an effects
// table: one row per applied record, with no unique constraint, so that a
// double effect shows as two rows.
func newPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return newPoolConns(t, 20)
}

// newPoolConns is newPool with a pool of at most conns connections.
func newPoolConns(t testing.TB, conns int32) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseT(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (
		n bigserial PRIMARY KEY, message_id text NOT NULL, key text, seq int)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// insertEffect is the handler body most tests use.
func insertEffect(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
	key, seq, _ := testenv.ParseKeyed(r.Value)
	_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`,
		consumer.Identity{}.Of(r), key, seq)
	return err
}

type effectCounts struct{ rows, unique int }

func countEffects(t testing.TB, pool *pgxpool.Pool) effectCounts {
	t.Helper()
	var c effectCounts
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT message_id) FROM effects`).Scan(&c.rows, &c.unique); err != nil {
		t.Fatal(err)
	}
	return c
}

func testLogger() *slog.Logger {
	if os.Getenv("KSCOPE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func baseConfig(k *testenv.Kafka, group, topic string) consumer.Config {
	return consumer.Config{
		Brokers:        k.Brokers,
		Group:          group,
		Topics:         []string{topic},
		Shards:         4,
		CommitInterval: 50 * time.Millisecond,
		DrainTimeout:   5 * time.Second,
		Logger:         testLogger(),
		GroupProtocol:  consumer.GroupProtocol(testenv.GroupProtocol()),
		// Short in-place backoff, and a budget no test exhausts unless it
		// means to.
		Failures: retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, RetryableAttempts: 1000},
	}
}

// run runs r until the returned stop is called.
func run(t testing.TB, r interface{ Run(context.Context) error }) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	stopped := false
	var err error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			err = <-errc
		}
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// runToEnd runs r until done reports true and the group's offsets cover
// topic, then stops it and fails the test if Run returned an error.
func runToEnd(t testing.TB, r interface{ Run(context.Context) error }, k *testenv.Kafka, group, topic string, what string, within time.Duration, done func() bool) {
	t.Helper()
	stop := run(t, r)
	testenv.WaitFor(t, within, what, done)
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// wantOutcomes fails the test unless r applied, skipped and dead-lettered
// the given numbers of records.
func wantOutcomes(t testing.TB, r *dbscope.Runner, applied, skipped, deadLettered int64) {
	t.Helper()
	st, f := r.Stats().DB, r.Stats().Failures
	if st.Applied != applied || st.Skipped != skipped || f.DeadLettered != deadLettered {
		t.Fatalf("stats %+v, failures %+v: want %d applied, %d skipped, %d dead-lettered", st, f, applied, skipped, deadLettered)
	}
}

// effectOrder returns the effects as "key/seq", in the order applied.
func effectOrder(t testing.TB, pool *pgxpool.Pool) []string {
	t.Helper()
	return effectColumn(t, pool, `key || '/' || seq`)
}

// wantKeyOrder fails the test unless each key's effects were applied in
// sequence order (the per-key order invariant).
func wantKeyOrder(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	last := map[string]int{}
	for _, e := range effectOrder(t, pool) {
		key, seq, ok := testenv.ParseKeyed([]byte(e))
		if !ok {
			t.Fatalf("effect %q is not key/seq", e)
		}
		if prev, seen := last[key]; seen && seq <= prev {
			t.Fatalf("key %s applied %d after %d", key, seq, prev)
		}
		last[key] = seq
	}
}

// effectKeys returns the effects' keys, in the order applied.
func effectKeys(t testing.TB, pool *pgxpool.Pool) []string {
	t.Helper()
	return effectColumn(t, pool, `key`)
}

// effectColumn returns expr of every effect row, in the order applied.
func effectColumn(t testing.TB, pool *pgxpool.Pool, expr string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT `+expr+` FROM effects ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

// newEither returns a DB-scope runner of qh when it is not nil, else of h.
func newEither(t testing.TB, cfg consumer.Config, o dbscope.Options, h dbscope.Handler, qh dbscope.QueueHandler) *dbscope.Runner {
	t.Helper()
	var r *dbscope.Runner
	var err error
	if qh != nil {
		r, err = dbscope.NewQueued(cfg, o, qh)
	} else {
		r, err = dbscope.New(cfg, o, h)
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}
