package outbox_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/codec"
	"github.com/kscope-dev/kscope/outbox"
)

// A typed event added to the outbox in the transaction of the change it
// announces.
func ExampleAddValue() {
	type Booked struct {
		Account string `json:"account"`
		Cents   int64  `json:"cents"`
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/payments")
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - 100 WHERE id = 'acct-1'`); err != nil {
			return err
		}
		_, err := outbox.AddValue(ctx, outbox.Writer{}, tx, codec.JSON[Booked](), "payment.booked", []byte("acct-1"), Booked{Account: "acct-1", Cents: 100})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}
