// Command quickstart consumes a topic with kscope's AtLeastOnce runner and
// prints each record. With no KAFKA_BROKERS it starts an in-process Kafka
// (kfake), writes a few keyed records to it, and stops once all of them are
// handled and committed:
//
//	go run ./examples/quickstart
//	KAFKA_BROKERS=localhost:9092 go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	kafka, err := testenv.StartKafka(ctx)
	if err != nil {
		return err
	}
	defer kafka.Close()
	const topic, keys, perKey = "quickstart.orders", 5, 4
	if err := kafka.CreateTopic(ctx, topic, 3); err != nil {
		return err
	}
	if err := kafka.Produce(ctx, testenv.KeyedRecords(topic, keys, perKey)...); err != nil {
		return err
	}
	fmt.Printf("kafka: %s (%s); produced %d records to %s\n", kafka.Kind, kafka.Brokers[0], keys*perKey, topic)

	var handled atomic.Int64
	runner, err := consumer.New(consumer.Config{
		Brokers: kafka.Brokers,
		Group:   "quickstart",
		Topics:  []string{topic},
		Shards:  4,
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}, consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
		fmt.Printf("partition %d offset %3d key %s value %s\n", r.Partition, r.Offset, r.Key, r.Value)
		handled.Add(1)
		return nil
	}))
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()

	deadline := time.Now().Add(time.Minute)
	for handled.Load() < keys*perKey && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		return err
	}
	offsets, err := kafka.CommittedOffsets(context.Background(), "quickstart", topic)
	if err != nil {
		return err
	}
	fmt.Printf("handled %d records; committed offsets %v\n", handled.Load(), offsets)
	if handled.Load() < keys*perKey {
		return fmt.Errorf("handled %d of %d records", handled.Load(), keys*perKey)
	}
	return nil
}
