package dbscope_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// A record that spent longer in the retry topics than the inbox TTL keeps
// its inbox row for the TTL after it is applied, as every other record
// does: the TTL counts from the record's outcome, not from its first
// attempt, so a redelivery soon after it was applied is still recognised
// as one (and not applied a second time).
func TestInboxTTLCountsFromTheOutcome(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "payments", "g-inbox-age"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Failures = retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		InPlaceAttempts: 1, Ladder: []time.Duration{100 * time.Millisecond}, RetryableAttempts: 1000}
	var fail atomic.Bool
	fail.Store(true)
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, rec *consumer.Record) error {
		if fail.Load() {
			return consumer.Retryable(errors.New("ledger 503"))
		}
		return insertEffect(ctx, tx, rec)
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, idRecord(topic, "k", "k/0", "pay-1")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the record in the retry topics", func() bool { return r.Stats().Failures.RetryTopic >= 1 })
	// The record has waited in the retry topics for an hour.
	if _, err := pool.Exec(ctx, `UPDATE kscope_inbox SET processed_at = now() - interval '1 hour' WHERE consumer = $1 AND message_id = 'pay-1'`, group); err != nil {
		t.Fatal(err)
	}
	fail.Store(false)
	testenv.WaitFor(t, time.Minute, "the record applied", func() bool { return countEffects(t, pool).unique == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	n, err := dbscope.CleanupInbox(ctx, pool, dbscope.CleanupOptions{Consumer: group, TTL: 30 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("a cleanup with a 30-minute TTL deleted %d inbox rows right after the record was applied; want 0", n)
	}
}
