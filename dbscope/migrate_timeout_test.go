package dbscope_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// Migrate honours its context: against a server that takes connections
// and never answers, before the connection's start-up completes or after
// it, it returns when the context's deadline passes instead of hanging.
func TestMigrateReturnsAtTheContextDeadline(t *testing.T) {
	for _, c := range []struct {
		name  string
		start func(testing.TB) string
	}{
		{"silent at start-up", testenv.SilentServer},
		{"silent after start-up", testenv.StalledPostgres},
	} {
		t.Run(c.name, func(t *testing.T) {
			var pool *pgxpool.Pool
			// Registered first, so run last: once the server closed its
			// connections, pgx's close of the one that timed out (a
			// cancel request, then a drain) is quick.
			t.Cleanup(func() {
				if pool != nil {
					pool.Close()
				}
			})
			addr := c.start(t)
			var err error
			pool, err = pgxpool.New(context.Background(), "postgres://kscope@"+addr+"/db?sslmode=disable")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			start := time.Now()
			err = dbscope.Migrate(ctx, pool, "")
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("Migrate returned after %v, with a 1s deadline", took.Round(time.Millisecond))
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Migrate: %v; want the context's deadline", err)
			}
		})
	}
}
