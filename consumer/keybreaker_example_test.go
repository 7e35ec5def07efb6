package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/kscope-dev/kscope/consumer"
)

// errAccountFrozen is what a payment gateway returns for one account
// while it is frozen; the other accounts are served.
var errAccountFrozen = errors.New("gateway: account frozen")

// The breaker of each key: an account whose payments fail three times
// within a minute with errAccountFrozen is held alone, its later payments
// waiting behind it, while every other account's payments go on; after
// 30 seconds its oldest payment is tried once, and if it succeeds the
// held ones run in order.
func ExampleKeyBreakerConfig() {
	charge := func(ctx context.Context, rec *consumer.Record) error { return nil }
	r, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "payments",
		Topics:  []string{"payments"}, // keyed by account
		KeyBreaker: &consumer.KeyBreakerConfig{
			Trips:    func(err error) bool { return errors.Is(err, errAccountFrozen) },
			Failures: 3, // at most Failures.InPlaceAttempts
			Window:   time.Minute,
			OpenFor:  30 * time.Second,
		},
	}, consumer.HandlerFunc(charge))
	if err != nil {
		log.Fatal(err)
	}
	st := r.Stats().KeyBreaker
	fmt.Println(st.HeldKeys, st.HeldRecords)
	// Output: 0 0
}
