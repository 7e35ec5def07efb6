package dbscope_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/keybreakercheck"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// In the DB scope, one failing key of 1,000 is held alone, in PostgreSQL,
// while the other 999 flow and commit; its records are served once, in
// order, after its probe succeeds, each effect applied once.
func TestKeyBreakerDB(t *testing.T) {
	k := testenv.KafkaT(t)
	pool := newPool(t)
	keybreakercheck.Run(t, k, "g-db-keybreaker", func(cfg consumer.Config, dep *keybreakercheck.Dep) (*consumer.Runner, error) {
		r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if err := dep.Call(r); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key) VALUES ($1, $2)`, string(r.Value), string(r.Key))
			return err
		}))
		if err != nil {
			return nil, err
		}
		return r.Runner, nil
	}, keybreakercheck.Check{Held: func(t *testing.T, r *consumer.Runner) {
		testenv.WaitFor(t, time.Minute, "Stats.DB.HeldKeys 1", func() bool { return r.Stats().DB.HeldKeys == 1 })
		if st := r.Stats().KeyBreaker; st.HeldKeys != 0 || st.Holds < 3 {
			t.Errorf("Stats.KeyBreaker %+v while the key is held; want its hold and two failed probes, none held in memory", st)
		}
	}})
	want := keybreakercheck.Keys*keybreakercheck.PerKey + 4*keybreakercheck.Later
	if c := countEffects(t, pool); c.rows != want || c.unique != want {
		t.Errorf("effects %+v; want %d, each once", c, want)
	}
}
