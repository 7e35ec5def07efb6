package intent_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/intent"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// A producer sent one capture twice, under two message ids: the DB scope
// applies both records (their identities differ), in one batch since they
// share a key, so in one transaction. The intent keyed by the payment
// makes one charge, and the second record's Do takes its answer instead
// of waiting for the transaction it runs in, which would hold the
// key-shard for ever.
func TestOnePaymentTwiceInOneBatch(t *testing.T) {
	pool, _, p := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE bookings (message_id text PRIMARY KEY, charge text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	k := testenv.KafkaT(t)
	const topic, group = "captures", "ledger"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	capture := func(id string) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: []byte("acct-1"), Value: []byte("pi_11"),
			Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}}
	}
	if err := k.Produce(ctx, capture("m-1"), capture("m-2")); err != nil {
		t.Fatal(err)
	}
	intents := intent.New(nil, "")
	defer intents.Close()
	var mu sync.Mutex
	var lastErr error // the handler's, for the failure message
	r, err := dbscope.New(consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{topic}, Shards: 1,
		CommitInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	}, dbscope.Options{Pool: pool, BatchLinger: 200 * time.Millisecond}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			res, _, err := intents.Do(ctx, tx, string(r.Value), p.charge, p.lookup)
			if err != nil {
				mu.Lock()
				lastErr = err
				mu.Unlock()
				return consumer.Retryable(err)
			}
			_, err = tx.Exec(ctx, `INSERT INTO bookings VALUES ($1, $2)`, consumer.Identity{}.Of(r), string(res))
			return err
		}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}()
	// Applied counts a transaction's records once it committed.
	deadline := time.Now().Add(30 * time.Second)
	for r.Stats().DB.Applied < 2 {
		if time.Now().After(deadline) {
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("the records were not applied within 30s (handler's last error: %v, stats %+v)", lastErr, r.Stats().DB)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var booked int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT charge) FROM bookings`).Scan(&booked); err != nil || booked != 1 {
		t.Fatalf("%d distinct charges booked (%v), want the one charge for both records", booked, err)
	}
	if n := r.Stats().DB.Transactions; n != 1 {
		t.Fatalf("the two records took %d transactions: the test wants them in one batch", n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.charges["pi_11"] != 1 || p.calls != 1 {
		t.Fatalf("%d charges in %d calls, want 1 in 1", p.charges["pi_11"], p.calls)
	}
}
