package intent_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/intent"
)

// gatewayClient stands for a payment provider's client: Charge takes an
// idempotency key, Lookup finds a charge by it.
type gatewayClient interface {
	Charge(ctx context.Context, idempotencyKey string, cents int64) (chargeID string, err error)
	Lookup(ctx context.Context, idempotencyKey string) (chargeID string, found bool, err error)
}

// A DB-scope handler charges a card once per payment, whatever crashes
// between the charge and the commit of the transaction that books it.
func ExampleStore_Do() {
	var gw gatewayClient // the provider's client
	intents := intent.New(nil, "")
	handler := dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		payment := consumer.Identity{}.Of(r) // stable across redeliveries
		charge, _, err := intents.Do(ctx, tx, payment,
			func(ctx context.Context, key string) ([]byte, error) {
				id, err := gw.Charge(ctx, key, 1999)
				return []byte(id), err
			},
			func(ctx context.Context, key string) ([]byte, bool, error) {
				id, found, err := gw.Lookup(ctx, key)
				return []byte(id), found, err
			})
		if err != nil {
			return consumer.Retryable(fmt.Errorf("charging %s: %w", payment, err))
		}
		_, err = tx.Exec(ctx, `INSERT INTO ledger (payment, charge) VALUES ($1, $2)`, payment, string(charge))
		return err
	})
	_ = handler // dbscope.New(cfg, dbscope.Options{Pool: pool}, handler)
}
