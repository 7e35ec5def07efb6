package txn_test

import (
	"context"
	"log"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/txn"
)

// A batch handler enriches the ready records of a key-shard with one
// lookup; each output is tied to its input, and commits with that input's
// offset.
func ExampleNewBatch() {
	r, err := txn.NewBatch(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "enricher",
		Topics:  []string{"orders"},
	}, txn.Options{TransactionalID: "enricher-1"}, txn.BatchHandlerFunc(
		func(ctx context.Context, recs []*consumer.Record, out txn.BatchEmitter) error {
			names, err := customerNames(ctx, recs)
			if err != nil {
				return err // no record is known done: each is handled again alone
			}
			for i, r := range recs {
				out.Emit(i, &kgo.Record{Topic: "orders.enriched", Key: r.Key, Value: append(r.Value, names[i]...)})
			}
			return nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

// customerNames stands in for one lookup of the customers of recs.
func customerNames(_ context.Context, recs []*consumer.Record) ([]string, error) {
	return make([]string, len(recs)), nil
}
