package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/kscope-dev/kscope/consumer"
)

// errLedgerDown is what a client of a dependency returns while it is
// down.
var errLedgerDown = errors.New("ledger API: 503")

// A breaker for the ledger API: three of its failures within ten seconds
// open it. While it is open, fetching is paused and the failing records
// wait in place (no retry topic, no dead-letter topic, no attempt used);
// after 30 seconds one probe call goes through, and its success closes the
// breaker.
func ExampleBreakerConfig() {
	postToLedger := func(ctx context.Context, rec *consumer.Record) error { return nil }
	r, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "billing",
		Topics:  []string{"invoices"},
		Breakers: []consumer.BreakerConfig{{
			Name:     "ledger",
			Trips:    func(err error) bool { return errors.Is(err, errLedgerDown) },
			Failures: 3, // at most Failures.InPlaceAttempts
			Window:   10 * time.Second,
			OpenFor:  30 * time.Second,
		}},
	}, consumer.HandlerFunc(postToLedger))
	if err != nil {
		log.Fatal(err)
	}
	for _, b := range r.Stats().Breakers {
		fmt.Println(b.Name, b.State, b.Trips)
	}
}
