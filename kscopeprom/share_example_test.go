package kscopeprom_test

import (
	"context"
	"log"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/kscopeprom"
)

// A member of a share group exports its counters (accepted, released,
// redelivered, lock renewals, acknowledgements refused, deliveries
// exhausted, in flight) and the group's backlog per partition, read every
// 30 seconds until the runner stops.
func ExampleMetrics_WatchShare() {
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		log.Fatal(err)
	}
	cfg := consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "thumbnails",
		Owner:   "media <#media-oncall>",
		Topics:  []string{"uploads"},
		Share:   &consumer.ShareConfig{MaxDeliveries: 5},
	}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		log.Fatal(err)
	}
	if err := m.WatchShare(r); err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		if err := m.WatchShareGroup(ctx, cfg, 30*time.Second); err != nil {
			log.Print(err)
		}
	}()
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// An operations service, no member of the group, exports a share group's
// backlog per partition (kscope_share_backlog_records), read every minute.
func ExampleMetrics_WatchShareGroup() {
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		log.Fatal(err)
	}
	cfg := consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "thumbnails",
		Share:   &consumer.ShareConfig{},
	}
	if err := m.WatchShareGroup(context.Background(), cfg, time.Minute); err != nil {
		log.Fatal(err)
	}
}
