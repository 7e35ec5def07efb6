package txn_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// An enricher reads orders and writes enriched orders. Each output and its
// input's offset commit in one Kafka transaction: a read_committed reader
// of orders.enriched sees each output once, across crashes and rebalances.
// The transactional id survives the member's restarts (a StatefulSet pod's
// name), so a restarted member fences its previous incarnation.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pod, _ := os.Hostname()
	r, err := txn.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "enricher",
		Topics:  []string{"orders"},
	}, txn.Options{TransactionalID: "enricher-" + pod}, txn.HandlerFunc(
		func(ctx context.Context, rec *consumer.Record, out txn.Emitter) error {
			if len(rec.Value) == 0 {
				return consumer.DecodeError(errors.New("empty order")) // dead-lettered inside the transaction
			}
			out.Emit(&kgo.Record{Topic: "orders.enriched", Key: rec.Key, Value: append([]byte("enriched "), rec.Value...)})
			return nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	switch err := r.Run(ctx); {
	case errors.Is(err, txn.ErrFenced):
		log.Fatal("another member runs with this transactional id: ", err)
	case err != nil:
		log.Fatal(err)
	}
}

// With Versions the scope checks each key's versions with no store
// outside Kafka: the last version of each key, and the records parked
// behind a gap, live in a compacted changelog topic written in the same
// transaction as the outputs.
func ExampleOptions_versions() {
	r, err := txn.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "accounts-projector",
		Topics:  []string{"accounts.state"},
	}, txn.Options{
		TransactionalID: "accounts-projector-0",
		Versions:        &sequence.Config{Gaps: sequence.Wait, GapTimeout: 5 * time.Minute},
	}, txn.HandlerFunc(func(ctx context.Context, rec *consumer.Record, out txn.Emitter) error {
		res, _ := sequence.FromContext(ctx) // the record's version check: stale ones never reach here
		out.Emit(&kgo.Record{Topic: "accounts.projection", Key: rec.Key, Value: fmt.Appendf(nil, "v%d %s", res.Version, rec.Value)})
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	_ = r
}

// The changelog topic that holds a group's versions of one input topic.
func ExampleVersionsTopic() {
	fmt.Println(txn.VersionsTopic("accounts-projector", "accounts.state"))
	// Output: accounts-projector.kscope-versions.accounts.state
}
