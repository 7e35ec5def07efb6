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
