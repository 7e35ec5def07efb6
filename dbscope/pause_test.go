package dbscope_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/pausecheck"
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

// In the DB scope, a rate limit paces the handler calls (the wait holds
// the record's transaction) and every effect is applied once.
func TestRateLimitDBScope(t *testing.T) {
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "db-rate", "g-db-rate"
	var recs []*kgo.Record
	for i := range 40 {
		recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%5), Value: fmt.Appendf(nil, "v%d", i)})
	}
	produceTo(t, k, topic, recs...)
	cfg := baseConfig(k, group, topic)
	cfg.RateLimit = consumer.RateLimit{Records: consumer.Rate{PerSecond: 100}}
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		return insertValue(ctx, tx, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	runToEnd(t, r, k, group, topic, "every record applied", time.Minute, func() bool { return r.Stats().DB.Applied == 40 })
	if took := time.Since(start); took < 390*time.Millisecond {
		t.Errorf("40 records at 100 a second took %s; want at least 390ms", took)
	}
	if c := countEffects(t, pool); c.rows != 40 || c.unique != 40 {
		t.Fatalf("effects %+v; want 40, each once", c)
	}
}
