package kscopeprom_test

import (
	"context"
	"math"
	"testing"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/kscopeprom"
)

// A pause shows as kscope_paused{target, reason}, valued when it began,
// while it is in force; its series goes when it ends.
func TestPausedGauge(t *testing.T) {
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := consumer.New(consumer.Config{Brokers: []string{"localhost:1"}, Group: "g", Topics: []string{"refunds"}, Hooks: []hook.Hook{m}},
		consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Pause(consumer.Topic("refunds"), consumer.PauseReason("ledger down")); err != nil {
		t.Fatal(err)
	}
	since := r.Paused()[0].Since
	labels := map[string]string{"consumer_group": "g", "target": "refunds", "reason": "ledger down"}
	if v := value(t, m.Gatherer(), "kscope_paused", labels); math.Abs(v-float64(since.UnixNano())/1e9) > 0.001 {
		t.Fatalf("kscope_paused = %v; want when the pause began, %v", v, float64(since.UnixNano())/1e9)
	}
	if err := r.Resume(consumer.All()); err != nil {
		t.Fatal(err)
	}
	if n := series(t, m.Gatherer(), "kscope_paused"); n != 0 {
		t.Fatalf("%d kscope_paused series after the resume; want none", n)
	}
}
