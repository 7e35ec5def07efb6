package redisstore_test

import (
	"context"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dedupe/redisstore"
)

// The AtLeastOnce scope's guard on Redis, with a client whose timeouts and
// retries bound how long a record waits for the store when Redis is
// unreachable.
func ExampleNew() {
	client := redis.NewClient(&redis.Options{
		Addr:         "localhost:6379",
		DialTimeout:  time.Second,
		ReadTimeout:  500 * time.Millisecond,
		WriteTimeout: 500 * time.Millisecond,
		MaxRetries:   1,
	})
	r, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "notifications",
		Topics:  []string{"orders.placed"},
		Dedupe: consumer.DedupeConfig{
			Store:       redisstore.New(client, redisstore.Options{Prefix: "notifications:dedupe:"}),
			Window:      time.Hour,
			Unavailable: consumer.FailOpen, // the handler is idempotent anyway: keep going while Redis is down
		},
	}, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		return nil // send the notification
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
