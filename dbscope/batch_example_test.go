package dbscope_test

import (
	"context"
	"encoding/json"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
)

// A batch handler writes the ledger rows of a whole transaction with one
// COPY. A capture that cannot be read is reported with FailedAt: it goes
// to the dead-letter topic on its own, and the other captures commit.
func ExampleNewBatch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/payments")
	if err != nil {
		log.Fatal(err)
	}
	r, err := dbscope.NewBatch(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "ledger",
		Topics:  []string{"payments.captured"},
	}, dbscope.Options{Pool: pool}, dbscope.BatchHandlerFunc(
		func(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
			rows := make([][]any, len(recs))
			for i, r := range recs {
				var c struct{ Cents int64 }
				if err := json.Unmarshal(r.Value, &c); err != nil {
					return consumer.FailedAt(i, consumer.DecodeError(err))
				}
				rows[i] = []any{r.Key, c.Cents}
			}
			// The inbox rows of recs and these rows commit together.
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"ledger"}, []string{"account", "cents"}, pgx.CopyFromRows(rows))
			return err
		}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
