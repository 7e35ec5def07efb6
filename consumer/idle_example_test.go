package consumer_test

import (
	"context"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/kscope-dev/kscope/consumer"
)

// A service that buffers what its handler sees flushes a partition's
// buffer when the partition has had no record for 30 seconds, and says
// so when the whole member went quiet.
func ExampleIdleConfig() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var mu sync.Mutex
	buffered := map[int32][][]byte{}
	r, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "archiver",
		Topics:  []string{"clicks"},
		Idle: consumer.IdleConfig{
			After: 30 * time.Second,
			Partition: func(ctx context.Context, topic string, p int32, since time.Time) {
				mu.Lock()
				defer mu.Unlock()
				slog.Info("flushing an idle partition", "topic", topic, "partition", p, "records", len(buffered[p]), "idle_since", since)
				delete(buffered, p) // write them out first; ctx ends if the partition is revoked
			},
			Member: func(ctx context.Context, since time.Time) {
				slog.Info("no clicks on any partition", "since", since)
			},
		},
	}, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		mu.Lock()
		defer mu.Unlock()
		buffered[rec.Partition] = append(buffered[rec.Partition], rec.Value)
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A service that keeps per-partition state in memory expires entries
// older than an hour every minute, on the partition's key-shard worker,
// while the partition is assigned to it.
func ExamplePeriodicConfig() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var mu sync.Mutex
	lastSeen := map[int32]map[string]time.Time{} // partition → key → when
	r, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "sessions",
		Topics:  []string{"logins"},
		Periodic: consumer.PeriodicConfig{
			Interval: time.Minute,
			Func: func(ctx context.Context, topic string, p int32) error {
				mu.Lock()
				defer mu.Unlock()
				for key, at := range lastSeen[p] {
					if time.Since(at) > time.Hour {
						delete(lastSeen[p], key)
					}
				}
				return nil // an error is logged and counted; the next call comes at the next interval
			},
		},
	}, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		mu.Lock()
		defer mu.Unlock()
		if lastSeen[rec.Partition] == nil {
			lastSeen[rec.Partition] = map[string]time.Time{}
		}
		lastSeen[rec.Partition][string(rec.Key)] = time.Now()
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
