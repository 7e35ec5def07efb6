package dbscope_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/breakercheck"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// In the DB scope, a dependency's breaker opens after its failures,
// pauses fetching, routes nothing while open, probes, and closes when the
// dependency recovers: every record's effect is committed once (the
// inbox), in key order, though its handler failed in transactions that
// rolled back while the breaker was open.
func TestBreakerDBScope(t *testing.T) {
	k := testenv.KafkaT(t)
	pool := newPool(t)
	breakercheck.Run(t, k, "g-db-breaker", func(cfg consumer.Config, dep *breakercheck.Dep) (*consumer.Runner, error) {
		r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if err := insertValue(ctx, tx, r); err != nil {
				return err
			}
			return dep.Call(r) // after a write: a failure rolls it back
		}))
		if err != nil {
			return nil, err
		}
		return r.Runner, nil
	})
	if c := countEffects(t, pool); c.rows != breakercheck.Keys*breakercheck.PerKey || c.unique != c.rows {
		t.Fatalf("effects %+v; want every record's once (%d)", c, breakercheck.Keys*breakercheck.PerKey)
	}
}
