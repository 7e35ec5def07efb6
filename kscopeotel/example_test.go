package kscopeotel_test

import (
	"context"
	"log"

	"go.opentelemetry.io/otel"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/kscopeotel"
)

// Deliveries are traced with the global TracerProvider (set up by the
// service's OpenTelemetry SDK); the handler's own spans nest under the
// delivery's, which nests under the producer's.
func Example() {
	tracer := kscopeotel.New(kscopeotel.Options{})
	cfg := consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "notifier",
		Topics:  []string{"notifications"},
		Hooks:   []hook.Hook{tracer},
		// Optional: franz-go's kotel client spans for produce and fetch.
		ClientOptions: tracer.ClientOptions(),
	}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
		_, span := otel.Tracer("notifier").Start(ctx, "send email")
		defer span.End()
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
