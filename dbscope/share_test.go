package dbscope_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/sequence"
)

// Two members of a share group share a partition, and handlers of one
// of them outlive their records' acquisition locks (renewals off): the
// broker gives those records to the other member while the first still
// runs, and both handle them. The inbox keeps the effects exactly-once:
// one row per record, the second transaction to commit a no-op.
//
// The slow member is the first to receive a record of seq 7. Its first
// slow handler waits until a member has received a record again: the
// redelivery is made to happen, not left to the timing of polls (a member
// whose handlers are all busy does not poll, and a broker may take the
// late acknowledgement of a record nobody fetched meanwhile). It cannot
// wait for the redelivery's handler: that one waits for the inbox row the
// slow transaction holds.
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
	// One partition: every member of the group is assigned it, so the
	// other member can fetch a record whose lock expired.
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, topic, 20, 15)

	var (
		mu          sync.Mutex
		slow        = -1 // the member whose handlers outlive their locks
		slowCount   int
		again       = make(chan struct{}) // closed once a member received a record again
		receivedOne sync.Once
	)
	hook := redeliveryHook(func(*kgo.Record) { receivedOne.Do(func() { close(again) }) })
	var runners []*dbscope.Runner
	for member := range 2 {
		cfg := baseConfig(k, group, topic)
		cfg.Share = &consumer.ShareConfig{RenewBefore: -1, LockDuration: lock}
		cfg.ClientOptions = append(cfg.ClientOptions, kgo.WithHooks(hook))
		r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, rec *consumer.Record) error {
			_, seq, _ := testenv.ParseKeyed(rec.Value)
			mu.Lock()
			if seq == 7 && slow == -1 {
				slow = member
			}
			wait := seq == 7 && slow == member && rec.DeliveryCount() == 1
			if wait {
				slowCount++
			}
			mu.Unlock()
			if wait {
				select {
				case <-again:
				case <-time.After(time.Minute):
					t.Errorf("%s: its lock expired a minute ago, and no member has received a record again", rec.Value)
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
	t.Cleanup(func() {
		for i, r := range runners {
			st := r.Stats()
			t.Logf("member %d: %+v, %d duplicates absorbed", i, st.Share, st.DB.Duplicates)
		}
	})
	testenv.WaitFor(t, 2*time.Minute, "every record applied", func() bool { return countEffects(t, pool).unique >= total })
	testenv.WaitFor(t, time.Minute, "every delivery finished", func() bool {
		return runners[0].Stats().InFlight == 0 && runners[1].Stats().InFlight == 0
	})
	var redelivered, duplicates int64
	for _, r := range runners {
		redelivered += r.Stats().Share.Redelivered
		duplicates += r.Stats().DB.Duplicates
	}
	mu.Lock()
	defer mu.Unlock()
	if slowCount == 0 || redelivered == 0 {
		t.Fatalf("%d slow deliveries, %d records delivered again: want at least one of each", slowCount, redelivered)
	}
	if duplicates == 0 {
		t.Errorf("%d records delivered again and no duplicate absorbed by the inbox", redelivered)
	}
	if c := countEffects(t, pool); c.rows != total || c.unique != total {
		t.Fatalf("%d effect rows for %d records (%d distinct): a redelivery was applied twice", c.rows, total, c.unique)
	}
}

// redeliveryHook calls f with each record a member polls with a delivery
// count above 1.
type redeliveryHook func(*kgo.Record)

func (f redeliveryHook) OnFetchRecordUnbuffered(r *kgo.Record, polled bool) {
	if polled && r.DeliveryCount() > 1 {
		f(r)
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
