package dbscope_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/pausecheck"
	"github.com/kscope-dev/kscope/internal/ratecheck"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// In the DB scope, a topic paused while its records flow is not handled
// until it is resumed, the other topic goes on, and a rebalance keeps it
// paused; every record's effect is applied once.
func TestPauseTopicDBScope(t *testing.T) {
	k := testenv.KafkaT(t)
	pool := newPool(t)
	pausecheck.Run(t, k, "g-db-pause", func(cfg consumer.Config) (*consumer.Runner, error) {
		r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(insertValue))
		if err != nil {
			return nil, err
		}
		return r.Runner, nil
	})
	if c := countEffects(t, pool); c.rows != c.unique || c.rows != 20*4+200+50 {
		t.Fatalf("effects %+v; want every record's once (%d)", c, 20*4+200+50)
	}
}

// In the DB scope, a rate limit of 200 records a second holds within 5%
// without a busy loop (internal/ratecheck: over 20 s on Apache Kafka, 3 s
// on kfake; under ScopeWorkBound, as each record's transaction costs
// round trips of its own), the wait holding the record's transaction; no
// effect is applied twice.
func TestRateLimitDBScope(t *testing.T) {
	k := testenv.KafkaT(t)
	// A connection for each of the check's 32 key-shards, whose waits
	// hold their transactions, and some for the runner's own work.
	pool := newPoolConns(t, 40)
	ratecheck.Run(t, k, baseConfig(k, "g-db-rate", ratecheck.Topic), ratecheck.ScopeWorkBound(t), func(cfg consumer.Config, handled func()) (*consumer.Runner, error) {
		r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			handled()
			return insertValue(ctx, tx, r)
		}))
		if err != nil {
			return nil, err
		}
		return r.Runner, nil
	})
	if c := countEffects(t, pool); c.rows != c.unique || c.rows == 0 {
		t.Fatalf("effects %+v; want each applied once", c)
	}
}
