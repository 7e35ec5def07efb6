package kscopeprom_test

import (
	"context"
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/kscopeprom"
)

// The metrics go into the process's default registry, next to the
// service's own, and /metrics serves them all.
func Example() {
	m, err := kscopeprom.New(kscopeprom.Options{Registerer: prometheus.DefaultRegisterer})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/metrics", m.Handler())
	go http.ListenAndServe(":9464", nil) //nolint:errcheck // example

	r, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "notifier",
		Topics:  []string{"notifications"},
		Hooks:   []hook.Hook{m},
	}, consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

// With EventTypeHeader, kscope_records_processed_total counts deliveries
// by the event type the record's "event-type" header names: the first 20
// by name, any later one as "other" (counted in
// kscope_event_type_overflow_total).
func ExampleOptions_eventType() {
	m, err := kscopeprom.New(kscopeprom.Options{EventTypeHeader: "event-type", EventTypeLimit: 20})
	if err != nil {
		log.Fatal(err)
	}
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "ledger", Topics: []string{"payments"}, Hooks: []hook.Hook{m}}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
