package txn_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// In the Kafka scope, consumer.Config.Periodic runs on every assigned
// partition, outside the transactions, and Config.Idle calls the member
// idle once the inputs are consumed; the inputs' outputs commit exactly
// once all the same.
func TestPeriodicAndIdleBesideTransactions(t *testing.T) {
	k := setup(t)
	good := produceInputs(t, k, 300, 0)
	var mu sync.Mutex
	calls := map[int32]int{}
	idle := 0
	cfg := config(k, "g-periodic")
	cfg.Periodic = consumer.PeriodicConfig{Interval: 50 * time.Millisecond, Func: func(_ context.Context, _ string, p int32) error {
		mu.Lock()
		defer mu.Unlock()
		calls[p]++
		return nil
	}}
	cfg.Idle = consumer.IdleConfig{After: 200 * time.Millisecond, Member: func(context.Context, time.Time) {
		mu.Lock()
		defer mu.Unlock()
		idle++
	}}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "periodic-1", CommitInterval: 20 * time.Millisecond}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, time.Minute, "every input committed", func() bool { return r.Stats().Kafka.Records == 300 })
	testenv.WaitFor(t, time.Minute, "periodic calls on every partition, and the member idle", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return calls[0] >= 2 && calls[1] >= 2 && calls[2] >= 2 && idle >= 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, good)
	if st := r.Stats().Periodic; st.Runs < 6 || st.Errors != 0 {
		t.Fatalf("Stats.Periodic = %+v; want every call counted as run", st)
	}
}
