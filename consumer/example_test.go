package consumer_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A service consumes a topic with one serial worker per key-shard: the
// records of one account are handled in order, different accounts in
// parallel, and an offset is committed only once its handler returned nil.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	r, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "notifications",
		Topics:  []string{"accounts.events"},
		Shards:  32,
	}, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		fmt.Printf("account %s: %s\n", rec.Key, rec.Value)
		return nil // an error retries this record in place; its offset is not committed past
	}))
	if err != nil {
		log.Fatal(err) // a bad Config: the error names the field and what to change
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A configuration that cannot work is rejected at construction, with every
// problem named.
func ExampleNew_badConfig() {
	_, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Topics:  []string{"payments", "payments"},
	}, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	fmt.Println(err)
	// Output:
	// kscope: Config.Group: no consumer group given; set it to the group id this service consumes as
	// kscope: Config.Topics: lists "payments" twice; list each topic once
}

// Record.Header reads a header by name.
func ExampleRecord_Header() {
	handle := func(ctx context.Context, rec *consumer.Record) error {
		if id, ok := rec.Header("message-id"); ok {
			fmt.Printf("message %s\n", id)
		}
		return nil
	}
	_ = consumer.HandlerFunc(handle)
}

// Identity.Of names a record the way the inbox and the idempotency guards
// do: the producer's message id when the record carries one, else its
// coordinates. Identity.Append writes the same bytes into a buffer of the
// caller's, for a lookup that should not allocate.
func ExampleIdentity() {
	var idn consumer.Identity // the default header, message-id
	withID := &consumer.Record{Record: &kgo.Record{Topic: "orders", Partition: 2, Offset: 41,
		Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte("order-7")}}}}
	bare := &consumer.Record{Record: &kgo.Record{Topic: "orders", Partition: 2, Offset: 42}}
	fmt.Println(idn.Of(withID))
	fmt.Println(idn.Of(bare))
	var buf [64]byte
	fmt.Println(string(idn.Append(buf[:0], bare)))
	// Output:
	// order-7
	// orders/2/42
	// orders/2/42
}
