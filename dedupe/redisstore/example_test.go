package redisstore_test

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kscope-dev/kscope/dedupe/redisstore"
)

// The Redis store on a client whose timeouts and retries bound how long a
// record waits for the store when Redis is unreachable.
func ExampleNew() {
	client := redis.NewClient(&redis.Options{
		Addr:         "localhost:6379",
		DialTimeout:  time.Second,
		ReadTimeout:  500 * time.Millisecond,
		WriteTimeout: 500 * time.Millisecond,
		MaxRetries:   1,
	})
	store := redisstore.New(client, redisstore.Options{Prefix: "orders:dedupe:"})
	_ = store // consumer.Config.Dedupe's Store
}
