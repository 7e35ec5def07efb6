package dbscope_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Two topics whose records share a key name: a parked head holds its own
// topic's key, and the retry topic, which both topics' failures share,
// brings their copies in one batch. Each topic's records of the key are
// applied once and in order.
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
	cfg.Failures = orderedPolicy(2, 10)
	// o/0 fails on its first delivery and its first hop, r/0 on its
	// first delivery: both park their topic's key k, and their copies
	// meet in the first retry topic.
	fails := map[string]int{"o/0": 2, "r/0": 1}
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			v, _ := r.Header(retrytopic.HeaderAttempt)
			attempt, _ := strconv.Atoi(string(v))
			if attempt < fails[string(r.Value)] {
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
	testenv.WaitFor(t, time.Minute, "every record applied", func() bool { return r.Stats().DB.Applied >= 6 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool {
		return k.CommittedAll(t, group, orders) && k.CommittedAll(t, group, refunds)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got := effectOrder(t, pool)
	for _, want := range [][]string{{"o/0", "o/1", "o/2"}, {"r/0", "r/1", "r/2"}} {
		mine := slices.DeleteFunc(slices.Clone(got), func(e string) bool { return !strings.HasPrefix(e, want[0][:2]) })
		if !slices.Equal(mine, want) {
			t.Errorf("effects %v, want %v in this order, each once (all: %v)", mine, want, got)
		}
	}
}
