package txn_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/txn"
)

// A retry record whose due time lies far beyond its topic's delay (a forged
// header, or a host whose clock runs years ahead) does not hold its retry
// partition: an aborted transaction rewinds the partition and the held
// record's due time is read again, so a cap relative to the time of
// reading would hold it for ever longer.
func TestFarFutureDueTimeDoesNotHoldTheRetryPartition(t *testing.T) {
	k := setup(t)
	cfg := config(k, "far-due")
	ladder := []time.Duration{500 * time.Millisecond}
	cfg.Failures = retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, RetryableAttempts: 4,
		Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, Ladder: ladder}
	retry := retrytopic.RetryTopic(cfg.Group, ladder[0])
	if err := k.CreateTopic(context.Background(), retry, 1); err != nil {
		t.Fatal(err)
	}
	year9999 := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := k.Produce(context.Background(),
		&kgo.Record{Topic: retry, Key: []byte("k"), Value: []byte("far"),
			Headers: []kgo.RecordHeader{{Key: consumer.HeaderDue, Value: []byte(strconv.FormatInt(year9999.UnixMilli(), 10))}}},
		&kgo.Record{Topic: retry, Key: []byte("k"), Value: []byte("behind")}); err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	r, err := txn.New(cfg, txn.Options{TransactionalID: "far-due-1"}, txn.HandlerFunc(
		func(ctx context.Context, rec *consumer.Record, out txn.Emitter) error {
			handled.Add(1)
			return enrich.Handle(ctx, rec, out)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, 20*time.Second, "both retry records handled", func() bool { return handled.Load() == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// A rung removed from the ladder between two deployments: the record
// waiting in it is still consumed and transformed.
func TestRemovedRetryRungIsDrained(t *testing.T) {
	k := setup(t)
	cfg := config(k, "rung-removed")
	ladder := []time.Duration{200 * time.Millisecond, 2 * time.Second}
	cfg.Failures = retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, RetryableAttempts: 10,
		Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, Ladder: ladder}
	if err := k.Produce(context.Background(), &kgo.Record{Topic: "in", Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	r, err := txn.New(cfg, txn.Options{TransactionalID: "rung-removed-1"}, txn.HandlerFunc(
		func(context.Context, *consumer.Record, txn.Emitter) error {
			calls.Add(1)
			return consumer.Retryable(errors.New("dependency down"))
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, 20*time.Second, "the record sent to the second rung", func() bool { return r.Stats().Kafka.RetryTopic >= 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	cfg.Failures.Ladder = ladder[:1]
	r, err = txn.New(cfg, txn.Options{TransactionalID: "rung-removed-1"}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	stop = runFor(t, r)
	testenv.WaitFor(t, 30*time.Second, "the record of the removed rung transformed", func() bool { return r.Stats().Kafka.Records >= 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, []string{"v"})
}
