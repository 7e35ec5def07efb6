package consumer_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/kscope-dev/kscope/consumer"
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
