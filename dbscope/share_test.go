package dbscope_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/sequence"
)

// Two members of a share group take the records of two partitions, and
// some handlers outlive their record's acquisition lock (renewals off):
// the broker gives those records to the other member while the first
// still runs, and both handle them. The inbox keeps the effects
// exactly-once: one row per record, the second delivery a no-op.
func TestShareGroupEffectsOnceWhenLocksExpire(t *testing.T) {
	const lock = 1500 * time.Millisecond
	k := testenv.KafkaT(t, kfake.BrokerConfigs(map[string]string{
		"group.share.heartbeat.interval.ms":   "100",
		"share.record.lock.sweep.interval.ms": "100",
		"group.share.record.lock.duration.ms": strconv.FormatInt(lock.Milliseconds(), 10),
	}))
	pool := newPool(t)
	ctx := context.Background()
	const topic, group = "payments", "g-db-share"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, topic, 20, 15)

	var runners []*dbscope.Runner
	for range 2 {
		cfg := baseConfig(k, group, topic)
		cfg.Share = &consumer.ShareConfig{RenewBefore: -1, LockDuration: lock}
		r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, rec *consumer.Record) error {
			_, seq, _ := testenv.ParseKeyed(rec.Value)
			if seq == 7 && rec.DeliveryCount() == 1 {
				select { // twice the lock: the record goes to the other member meanwhile
				case <-time.After(2 * lock):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return insertEffect(ctx, tx, rec)
		}))
		if err != nil {
			t.Fatal(err)
		}
		runners = append(runners, r)
		run(t, r)
	}
	testenv.WaitFor(t, 2*time.Minute, "every record applied", func() bool { return countEffects(t, pool).unique >= total })
	redelivered := func() (n int64) {
		for _, r := range runners {
			n += r.Stats().Share.Redelivered
		}
		return n
	}
	// A lock that expired while its handler ran gives the record to
	// whichever member fetches next (the broker may also take the late
	// acknowledgement of a record nobody fetched meanwhile: then there is
	// no second delivery).
	testenv.WaitFor(t, time.Minute, "a record delivered again after its lock expired", func() bool { return redelivered() > 0 })
	testenv.WaitFor(t, time.Minute, "every delivery finished", func() bool {
		return runners[0].Stats().InFlight == 0 && runners[1].Stats().InFlight == 0
	})
	if c := countEffects(t, pool); c.rows != total || c.unique != total {
		t.Fatalf("%d effect rows for %d records (%d distinct): a redelivery was applied twice", c.rows, total, c.unique)
	}
}

// A share group's DB scope refuses what needs an order or offsets it does
// not have.
func TestShareGroupDBRefusals(t *testing.T) {
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}, Share: &consumer.ShareConfig{}}
	h := dbscope.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Record) error { return nil })
	for field, o := range map[string]dbscope.Options{
		"StoreOffsets": {StoreOffsets: true},
		"Versions":     {Versions: &sequence.Config{}},
	} {
		o.Pool = newPoolStub(t)
		_, err := dbscope.New(cfg, o, h)
		var ce *consumer.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), field) || !strings.Contains(err.Error(), "Share") {
			t.Errorf("%s: got %v, want a ConfigError naming it and Share", field, err)
		}
	}
}

// newPoolStub is a pool that never connects: for constructors that only
// check it is there.
func newPoolStub(t *testing.T) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), "postgres://localhost:1/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
