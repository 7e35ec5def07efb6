package dedupe_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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

// The PostgreSQL store: NewPostgres checks the options, Migrate creates
// the table and its index once.
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
	_ = store // consumer.Config.Dedupe's Store
}
