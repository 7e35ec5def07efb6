package dedupe_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dedupe"
)

// A store remembers identities for a window: what Seen reports, per id.
func ExampleMemory() {
	ctx := context.Background()
	s := dedupe.NewMemory(0)
	if err := s.Remember(ctx, []string{"order-1", "order-2"}, 24*time.Hour); err != nil {
		log.Fatal(err)
	}
	seen, _ := s.Seen(ctx, []string{"order-1", "order-3", "order-2"})
	fmt.Println(seen)
	// Output: [true false true]
}

// The AtLeastOnce scope's guard on PostgreSQL: NewPostgres checks the
// options, Migrate creates the table and its index once, and the runner
// deletes expired rows every CleanupInterval.
func ExampleNewPostgres() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/orders")
	if err != nil {
		log.Fatal(err)
	}
	store, err := dedupe.NewPostgres(pool, dedupe.PostgresOptions{Table: "orders_dedupe"})
	if err != nil {
		log.Fatal(err) // a table name that is not a plain identifier, say
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	r, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "shipping",
		Topics:  []string{"orders.paid"},
		Dedupe:  consumer.DedupeConfig{Store: store, Window: 7 * 24 * time.Hour},
	}, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		return nil // ship the order: once per message id within the week, but for the crash window
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
