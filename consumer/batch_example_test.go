package consumer_test

import (
	"context"
	"log"

	"github.com/kscope-dev/kscope/consumer"
)

// A batch handler sends the ready records of a key-shard to a bulk API in
// one request; the API says which item it refused, and FailedAt routes
// that record alone (the records before it are done, those after it go
// again).
func ExampleNewBatch() {
	r, err := consumer.NewBatch(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "search-indexer",
		Topics:  []string{"products.changed"},
	}, consumer.BatchHandlerFunc(func(ctx context.Context, recs []*consumer.Record) error {
		if i, err := bulkIndex(ctx, recs); err != nil {
			return consumer.FailedAt(i, err)
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

// bulkIndex stands in for a bulk API: it returns the index of the first
// record it refused, and why.
func bulkIndex(context.Context, []*consumer.Record) (int, error) { return 0, nil }
