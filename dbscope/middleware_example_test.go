package dbscope_test

import (
	"context"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
)

// A chain of middleware around a DB-scope handler: logging outermost, so
// that it sees a panic of the handler as an error, and a deadline on the
// handler's statements.
func ExampleChain() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/ledger")
	if err != nil {
		log.Fatal(err)
	}
	logging := func(next dbscope.Handler) dbscope.Handler {
		return dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			err := next.Handle(ctx, tx, r)
			if err != nil {
				slog.Warn("handler failed", "topic", r.Topic, "offset", r.Offset, "err", err)
			}
			return err
		})
	}
	book := dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (account, event) VALUES ($1, $2)`, r.Key, r.Value)
		return err
	})
	r, err := dbscope.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "ledger",
		Topics:  []string{"payments.captured"},
	}, dbscope.Options{Pool: pool}, dbscope.Chain(book, logging, dbscope.Recover(), dbscope.Timeout(2*time.Second)))
	if err != nil {
		log.Fatal(err)
	}
	_ = r // r.Run(ctx)
}
