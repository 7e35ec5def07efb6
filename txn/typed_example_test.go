package txn_test

import (
	"context"
	"log"
	"os"

	"github.com/kscope-dev/kscope/codec"
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/txn"
)

// A typed Kafka-scope handler: orders in, enriched orders out, both JSON.
// The output and the input's offset commit in one transaction; an order
// that does not decode is dead-lettered inside it instead.
func ExampleTyped() {
	type Order struct {
		ID    string `json:"id"`
		Cents int64  `json:"cents"`
	}
	type Enriched struct {
		Order
		Euros float64 `json:"euros"`
	}
	in, out := codec.JSON[Order](), codec.JSON[Enriched]()
	pod, _ := os.Hostname()
	r, err := txn.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "enricher",
		Topics:  []string{"orders"},
	}, txn.Options{TransactionalID: "enricher-" + pod}, txn.Typed(in,
		func(ctx context.Context, r *consumer.Record, o Order, em txn.Emitter) error {
			return txn.EmitValue(ctx, em, out, "orders.enriched", r.Key, Enriched{Order: o, Euros: float64(o.Cents) / 100})
		}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
