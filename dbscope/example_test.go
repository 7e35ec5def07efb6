package dbscope_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
)

// A payments service writes one ledger row per capture event. The event's
// payment intent id travels as the message-id header, so a capture produced
// twice is booked once.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/payments")
	if err != nil {
		log.Fatal(err)
	}
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		log.Fatal(err)
	}
	r, err := dbscope.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "ledger",
		Topics:  []string{"payments.captured"},
	}, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (account, event) VALUES ($1, $2)`, r.Key, r.Value)
			return err // the inbox row and this insert commit together, or neither does
		}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A handler whose effect needs no result queues its statements: the DB
// scope sends those of a whole batch in one round trip, in the batch's
// transaction, with the inbox rows.
func ExampleNewQueued() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/payments")
	if err != nil {
		log.Fatal(err)
	}
	r, err := dbscope.NewQueued(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "ledger",
		Topics:  []string{"payments.captured"},
	}, dbscope.Options{Pool: pool}, dbscope.QueueFunc(
		func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
			q.Exec(`INSERT INTO ledger (account, event) VALUES ($1, $2)`, r.Key, r.Value)
			return nil // the statement runs, pipelined with its batch's, before COMMIT
		}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Inbox rows older than the retention are deleted in bounded batches; run it
// from a job, or set Options.InboxTTL to have the runner do it.
func ExampleCleanupInbox() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/payments")
	if err != nil {
		log.Fatal(err)
	}
	_, err = dbscope.CleanupInbox(ctx, pool, dbscope.CleanupOptions{Consumer: "ledger", TTL: 14 * 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
}
