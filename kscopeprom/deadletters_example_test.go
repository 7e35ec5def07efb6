package kscopeprom_test

import (
	"context"
	"log"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/kscopeprom"
)

// The service exports its dead letters waiting for triage next to the
// runner's metrics: counted every minute, until the runner stops.
func ExampleMetrics_WatchDeadLetters() {
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		log.Fatal(err)
	}
	cfg := consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "payments",
		Owner:   "payments <#payments-oncall>",
		Topics:  []string{"captures"},
		Hooks:   []hook.Hook{m},
	}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		if err := m.WatchDeadLetters(ctx, cfg, time.Minute); err != nil {
			log.Print(err)
		}
	}()
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
