package dbscope_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// A pool narrower than the key-shards is accepted, with a warning at
// start that says what to change.
func TestNarrowPoolWarns(t *testing.T) {
	ctx := context.Background()
	wide := newPool(t) // migrates the database
	pcfg := wide.Config().Copy()
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	k := testenv.KafkaT(t)
	if err := k.CreateTopic(ctx, "narrow", 1); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	cfg := baseConfig(k, "g-narrow", "narrow")
	cfg.Shards = 16
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "the partition assigned", func() bool { return r.Stats().Assigned > 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); !strings.Contains(out, "fewer connections than the runner has key-shards") || !strings.Contains(out, "pool_max_conns=4") ||
		!strings.Contains(out, "add pool_max_conns=16 to the database URL") {
		t.Fatalf("no warning about the pool's width:\n%s", out)
	}
}
