package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/kscope-dev/kscope/consumer"
)

// An operator's endpoint pauses a topic while its dependency is down, and
// resumes it after; the other topics go on. A pause holds across
// rebalances; with PersistPause, across restarts too.
func ExampleRunner_Pause() {
	r, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "billing",
		Topics:  []string{"invoices", "refunds"},
	}, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error { return nil }))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Pause(consumer.Topic("refunds"), consumer.PauseReason("ledger maintenance"), consumer.PersistPause()); err != nil {
		log.Print(err) // in force in this runner; not persisted
	}
	for _, p := range r.Paused() {
		fmt.Println(p.Target, p.Reason, p.Persisted)
	}
	// ... later:
	if err := r.Resume(consumer.Topic("refunds")); err != nil {
		log.Print(err)
	}
}

// errDown is what a client of a dependency returns while it is down.
var errDown = errors.New("payments API: 503")

// A handler that finds its dependency down pauses its own topic for 30
// seconds (a circuit breaker's open state) and returns its error: the
// record follows the failure policy, the records already polled finish,
// and no more are fetched until the pause ends.
func ExamplePauseFrom() {
	charge := func(ctx context.Context, rec *consumer.Record) error { return errDown }
	h := consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		err := charge(ctx, rec)
		if errors.Is(err, errDown) {
			if perr := consumer.PauseFrom(ctx, consumer.Topic(rec.Topic), consumer.PauseFor(30*time.Second), consumer.PauseReason("payments down")); perr != nil {
				return errors.Join(err, perr)
			}
			return consumer.Retryable(err)
		}
		return err
	})
	_ = h
}

// A limit of 200 handler calls a second for the runner, 20 for each
// customer, and 5 MiB a second of record bytes, taken before each
// handler call.
func ExampleRateLimit() {
	cfg := consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "mailer",
		Topics:  []string{"emails"},
		RateLimit: consumer.RateLimit{
			Records: consumer.Rate{PerSecond: 200},
			Bytes:   consumer.Rate{PerSecond: 5 << 20},
			PerKey:  consumer.Rate{PerSecond: 20},
		},
	}
	_, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error { return nil }))
	fmt.Println(err)
	// Output: <nil>
}
