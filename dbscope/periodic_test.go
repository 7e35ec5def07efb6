package dbscope_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// Options.Periodic runs in a transaction per call: what a call that
// returns nil wrote is committed, what a failing call wrote is rolled
// back, and the failing call runs again at the next interval.
func TestPeriodicCommitsOrRollsBack(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic = "sessions"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls := map[int32]int{}
	periodic := func(ctx context.Context, tx pgx.Tx, topic string, p int32) error {
		mu.Lock()
		calls[p]++
		n := calls[p]
		mu.Unlock()
		fail := n%2 == 1 // every other call fails, after its write
		key := "ok"
		if fail {
			key = "fail"
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`,
			fmt.Sprintf("%s/%d", topic, p), key, n); err != nil {
			return err
		}
		if fail {
			return errors.New("the expiry found something it cannot handle")
		}
		return nil
	}
	r, err := dbscope.New(baseConfig(k, "g-periodic", topic), dbscope.Options{Pool: pool,
		Periodic: dbscope.Periodic{Interval: 50 * time.Millisecond, Func: periodic}},
		dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "periodic calls on both partitions, committed and failed", func() bool {
		st := r.Stats().Periodic
		return st.Runs >= 4 && st.Errors >= 4
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := r.Stats().Periodic
	keys := effectKeys(t, pool)
	for _, key := range keys {
		if key != "ok" {
			t.Fatalf("effects %v: a failed periodic call's write was committed", keys)
		}
	}
	if int64(len(keys)) != st.Runs {
		t.Fatalf("%d rows for %d periodic calls that committed (stats %+v)", len(keys), st.Runs, st)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls[0] < 2 || calls[1] < 2 {
		t.Fatalf("periodic calls per partition: %v; want both partitions called again after a failure", calls)
	}
}

// Options.Periodic takes the place of consumer.Config.Periodic: both at
// once are refused, and so is a Periodic that cannot work.
func TestPeriodicConfigRefused(t *testing.T) {
	noop := func(context.Context, pgx.Tx, string, int32) error { return nil }
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"},
		Periodic: consumer.PeriodicConfig{Interval: time.Second, Func: func(context.Context, string, int32) error { return nil }}}
	_, err := dbscope.New(cfg, dbscope.Options{Periodic: dbscope.Periodic{Interval: time.Second, Func: noop}}, dbscope.HandlerFunc(insertEffect))
	if err == nil || !strings.Contains(err.Error(), "Config.Periodic:") {
		t.Fatalf("New: %v; want Config.Periodic refused beside Options.Periodic", err)
	}
	cfg.Periodic = consumer.PeriodicConfig{}
	_, err = dbscope.New(cfg, dbscope.Options{Periodic: dbscope.Periodic{Interval: time.Second}}, dbscope.HandlerFunc(insertEffect))
	if err == nil || !strings.Contains(err.Error(), "dbscope.Options.Periodic.Func:") {
		t.Fatalf("New: %v; want Options.Periodic.Func refused", err)
	}
}
