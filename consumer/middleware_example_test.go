package consumer_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/kscope-dev/kscope/consumer"
)

// A chain of middleware around a handler: logging outermost, so that it
// sees a panic of the handler as an error (Recover is inside it), and a
// deadline on the handler alone.
func ExampleChain() {
	logging := func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
			err := next.Handle(ctx, r)
			if err != nil {
				slog.Warn("handler failed", "topic", r.Topic, "offset", r.Offset, "err", err)
			}
			return err
		})
	}
	h := consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
		return nil // the service's work, honouring ctx
	})
	r, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "billing",
		Topics:  []string{"invoices"},
	}, consumer.Chain(h, logging, consumer.Recover(), consumer.Timeout(2*time.Second)))
	if err != nil {
		log.Fatal(err)
	}
	_ = r // r.Run(ctx)
}

// Filters, expiry and a deadline for every handler call, set on the
// Config: records marked as tests are dropped, a notification older than
// ten minutes is not worth sending any more, and a call gets five seconds.
func ExampleConfig_handlerCall() {
	cfg := consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "notifier",
		Topics:  []string{"notifications"},
		Keep: func(r *consumer.Record) bool {
			_, test := r.Header("test")
			return !test
		},
		MaxAge:         10 * time.Minute,
		Expired:        consumer.ExpiredSkip,
		HandlerTimeout: 5 * time.Second,
	}
	_, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error { return nil }))
	fmt.Println(err)
	// Output: <nil>
}
