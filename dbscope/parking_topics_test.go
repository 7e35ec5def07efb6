package dbscope_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Two topics whose records share a key name: a parked head holds its own
// topic's key only. While orders' head of k keeps failing in the retry
// topics, refunds' k (whose head failed once, into the same retry topics)
// is applied to its end; once orders' head succeeds, its key follows.
// Each topic's records are applied once and in order.
func TestDBParkingKeepsTopicsApart(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const orders, refunds, group = "orders", "refunds", "g-park-topics"
	for _, topic := range []string{orders, refunds} {
		if err := k.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
	}
	cfg := baseConfig(k, group, orders)
	cfg.Topics = []string{orders, refunds}
	cfg.Failures = orderedPolicy(2, 1000)
	// o/0 fails until released (it goes round the last retry topic), r/0
	// on its first delivery only: both park their topic's key k.
	var released atomic.Bool
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			v, _ := r.Header(retrytopic.HeaderAttempt)
			attempt, _ := strconv.Atoi(string(v))
			if (string(r.Value) == "o/0" && !released.Load()) || (string(r.Value) == "r/0" && attempt < 1) {
				return consumer.Retryable(errors.New("ledger service 503"))
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, idRecord(orders, "k", "o/0", "o0"), idRecord(refunds, "k", "r/0", "r0")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "both heads in a retry topic", func() bool { return r.Stats().Failures.RetryTopic >= 2 })
	if err := k.Produce(ctx, idRecord(orders, "k", "o/1", "o1"), idRecord(refunds, "k", "r/1", "r1"),
		idRecord(orders, "k", "o/2", "o2"), idRecord(refunds, "k", "r/2", "r2")); err != nil {
		t.Fatal(err)
	}
	of := func(prefix string) []string {
		return slices.DeleteFunc(effectOrder(t, pool), func(e string) bool { return !strings.HasPrefix(e, prefix) })
	}
	testenv.WaitFor(t, time.Minute, "refunds' k applied while orders' k is parked", func() bool { return len(of("r/")) == 3 })
	if got := of("o/"); len(got) != 0 {
		t.Fatalf("orders' effects %v while its head o/0 still fails, want none", got)
	}
	released.Store(true)
	testenv.WaitFor(t, time.Minute, "every record applied", func() bool { return r.Stats().DB.Applied >= 6 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool {
		return k.CommittedAll(t, group, orders) && k.CommittedAll(t, group, refunds)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, want := range [][]string{{"o/0", "o/1", "o/2"}, {"r/0", "r/1", "r/2"}} {
		if mine := of(want[0][:2]); !slices.Equal(mine, want) {
			t.Errorf("effects %v, want %v in this order, each once (all: %v)", mine, want, effectOrder(t, pool))
		}
	}
}
