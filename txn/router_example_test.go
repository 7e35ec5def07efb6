package txn_test

import (
	"context"
	"log"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/txn"
)

// One Kafka-scope runner turns orders and payments into their own
// outputs, each produced in its input's transaction; records of any other
// topic it consumes go to the default.
func ExampleRouter() {
	forward := func(to string) txn.Handler {
		return txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
			out.Emit(&kgo.Record{Topic: to, Key: r.Key, Value: r.Value})
			return nil
		})
	}
	router := txn.NewRouter().
		Topic("orders", forward("orders.accepted")).
		Topic("payments", forward("payments.booked")).
		Default(forward("unsorted"))
	r, err := txn.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "enricher",
		Topics:  []string{"orders", "payments", "returns"},
	}, txn.Options{TransactionalID: "enricher-0"}, router)
	if err != nil {
		log.Fatal(err)
	}
	_ = r // r.Run(ctx)
}
