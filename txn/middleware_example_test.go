package txn_test

import (
	"context"
	"log"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/txn"
)

// A chain of middleware around a Kafka-scope handler: logging outermost,
// so that it sees a panic of the handler as an error, and a deadline on
// the handler alone.
func ExampleChain() {
	logging := func(next txn.Handler) txn.Handler {
		return txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
			err := next.Handle(ctx, r, out)
			if err != nil {
				slog.Warn("handler failed", "topic", r.Topic, "offset", r.Offset, "err", err)
			}
			return err
		})
	}
	enrich := txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
		out.Emit(&kgo.Record{Topic: "orders.enriched", Key: r.Key, Value: r.Value})
		return nil
	})
	r, err := txn.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "enricher",
		Topics:  []string{"orders"},
	}, txn.Options{TransactionalID: "enricher-1"}, txn.Chain(enrich, logging, txn.Recover(), txn.Timeout(2*time.Second)))
	if err != nil {
		log.Fatal(err)
	}
	_ = r // r.Run(ctx)
}
