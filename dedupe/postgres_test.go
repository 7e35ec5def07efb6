package dedupe_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/dedupe/dedupetest"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// newPGPool returns a pool on a fresh database of the shared throwaway
// PostgreSQL (or DATABASE_URL's server).
func newPGPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.DatabaseT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newPostgres(t *testing.T, pool *pgxpool.Pool, o dedupe.PostgresOptions) *dedupe.Postgres {
	t.Helper()
	s, err := dedupe.NewPostgres(pool, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPostgresConformance(t *testing.T) {
	dedupetest.Run(t, func(t *testing.T) dedupe.Store {
		return newPostgres(t, newPGPool(t), dedupe.PostgresOptions{})
	})
}

// Migrate creates the table and its index on expires_at, and can run
// again; two tables in one database are two stores.
func TestPostgresMigrateCreatesTheTableAndItsIndex(t *testing.T) {
	ctx := context.Background()
	pool := newPGPool(t)
	a := newPostgres(t, pool, dedupe.PostgresOptions{})
	b := newPostgres(t, pool, dedupe.PostgresOptions{Table: "orders_dedupe"})
	if err := a.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	var idx string
	if err := pool.QueryRow(ctx, `SELECT indexdef FROM pg_indexes WHERE tablename = 'kscope_dedupe' AND indexdef LIKE '%(expires_at)'`).Scan(&idx); err != nil {
		t.Fatalf("no index on kscope_dedupe (expires_at): %v", err)
	}
	if err := a.Remember(ctx, []string{"x"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Seen(ctx, []string{"x"}); err != nil || got[0] {
		t.Fatalf("the store on orders_dedupe sees kscope_dedupe's id: %v, %v", got, err)
	}
}

// Cleanup deletes in batches of CleanupBatch rows until none is left, and
// only expired rows.
func TestPostgresCleanupDeletesInBatches(t *testing.T) {
	ctx := context.Background()
	pool := newPGPool(t)
	s := newPostgres(t, pool, dedupe.PostgresOptions{CleanupBatch: 3})
	var expired []string
	for i := range 10 {
		expired = append(expired, "expired-"+string(rune('a'+i)))
	}
	if err := s.Remember(ctx, []string{"kept"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Rows whose window passed, written directly: no wait.
	if _, err := pool.Exec(ctx, `INSERT INTO kscope_dedupe (id, expires_at) SELECT unnest($1::text[]), now() - interval '1 second'`, expired); err != nil {
		t.Fatal(err)
	}
	n, err := s.Cleanup(ctx)
	if err != nil || n != 10 {
		t.Fatalf("Cleanup = %d, %v; want 10 rows deleted", n, err)
	}
	var left []string
	rows, _ := pool.Query(ctx, `SELECT id FROM kscope_dedupe`)
	for rows.Next() {
		var id string
		rows.Scan(&id) //nolint:errcheck // checked by rows.Err
		left = append(left, id)
	}
	if rows.Err() != nil || len(left) != 1 || left[0] != "kept" {
		t.Fatalf("rows left after Cleanup: %v (%v), want [kept]", left, rows.Err())
	}
}

// A bad table name or batch is refused at construction, saying what to
// change.
func TestNewPostgresRefusesBadOptions(t *testing.T) {
	pool := newPGPool(t)
	for _, c := range []struct {
		o    dedupe.PostgresOptions
		want string
	}{
		{dedupe.PostgresOptions{Table: "orders; DROP TABLE x"}, "not a plain SQL identifier"},
		{dedupe.PostgresOptions{Table: "Orders"}, "lower-case letters"},
		{dedupe.PostgresOptions{Table: "public.orders"}, "not a plain SQL identifier"},
		{dedupe.PostgresOptions{Table: strings.Repeat("t", 49)}, "at most 48 characters"},
		{dedupe.PostgresOptions{CleanupBatch: -1}, "CleanupBatch is -1"},
	} {
		if _, err := dedupe.NewPostgres(pool, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewPostgres(%+v) = %v, want an error saying %q", c.o, err, c.want)
		}
	}
	if _, err := dedupe.NewPostgres(nil, dedupe.PostgresOptions{}); err == nil || !strings.Contains(err.Error(), "needs a pool") {
		t.Errorf("NewPostgres(nil) = %v, want an error saying it needs a pool", err)
	}
}

// A store whose database is unreachable returns errors (the runner's
// Unavailable setting decides what then), and answers again once it is
// back.
func TestPostgresUnavailableReturnsErrorsThenRecovers(t *testing.T) {
	ctx := context.Background()
	url := testenv.DatabaseT(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newPostgres(t, pool, dedupe.PostgresOptions{})
	if err := s.Remember(ctx, []string{"a"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := testenv.RefuseConnections(ctx, url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.AcceptConnections(context.Background(), url) }) //nolint:errcheck // restored below too
	if _, err := s.Seen(ctx, []string{"a"}); err == nil {
		t.Fatal("Seen succeeded on a database that refuses connections")
	}
	if err := s.Remember(ctx, []string{"b"}, time.Hour); err == nil {
		t.Fatal("Remember succeeded on a database that refuses connections")
	}
	if err := testenv.AcceptConnections(ctx, url); err != nil {
		t.Fatal(err)
	}
	got, err := s.Seen(ctx, []string{"a", "b"})
	if err != nil || !slices.Equal(got, []bool{true, false}) {
		t.Fatalf("Seen(a, b) once the database is back = %v, %v; want [true false]", got, err)
	}
}
