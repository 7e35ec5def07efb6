package dbscope_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
)

// One DB-scope runner applies orders and refunds, each in its record's
// transaction beside its inbox row; a payment event of another type has no
// route and goes to the dead-letter topic.
func ExampleRouter() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/shop")
	if err != nil {
		log.Fatal(err)
	}
	router := dbscope.NewRouter().
		Topic("orders", dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			_, err := tx.Exec(ctx, `INSERT INTO orders (id, body) VALUES ($1, $2)`, r.Key, r.Value)
			return err
		})).
		Header("payments", "event-type", "refund", dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			_, err := tx.Exec(ctx, `UPDATE orders SET refunded = true WHERE id = $1`, r.Key)
			return err
		}))
	r, err := dbscope.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "shop",
		Topics:  []string{"orders", "payments"},
	}, dbscope.Options{Pool: pool}, router)
	if err != nil {
		log.Fatal(err)
	}
	_ = r // r.Run(ctx)
}

// A QueueRouter routes records to handlers that queue their statements
// (dbscope.NewQueued): here by event type, with a default for the rest.
func ExampleQueueRouter() {
	pool, err := pgxpool.New(context.Background(), "postgres://localhost/shop")
	if err != nil {
		log.Fatal(err)
	}
	router := dbscope.NewQueueRouter().
		Header("payments", "event-type", "refund", dbscope.QueueFunc(func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
			q.Exec(`UPDATE orders SET refunded = true WHERE id = $1`, r.Key)
			return nil
		})).
		Default(dbscope.QueueFunc(func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
			q.Exec(`INSERT INTO payments (id, body) VALUES ($1, $2)`, r.Key, r.Value)
			return nil
		}))
	r, err := dbscope.NewQueued(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "shop",
		Topics:  []string{"payments"},
	}, dbscope.Options{Pool: pool}, router)
	if err != nil {
		log.Fatal(err)
	}
	_ = r // r.Run(ctx)
}
