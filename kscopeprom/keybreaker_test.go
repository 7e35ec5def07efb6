package kscopeprom_test

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/keybreakercheck"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/kscopeprom"
)

// A key held by its circuit breaker shows in kscope_held_keys while it
// is held, each hold (the first and each failed probe) counts in
// kscope_key_holds_total, and the gauge is back at 0 once it is
// released.
func TestKeyBreakerMetrics(t *testing.T) {
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	k := testenv.KafkaT(t)
	const group = "g-kb-metrics"
	g := map[string]string{"consumer_group": group}
	keybreakercheck.Run(t, k, group, func(cfg consumer.Config, dep *keybreakercheck.Dep) (*consumer.Runner, error) {
		cfg.Hooks = append(cfg.Hooks, m)
		return consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error { return dep.Call(r) }))
	}, keybreakercheck.Check{Held: func(t *testing.T, r *consumer.Runner) {
		if v := value(t, m.Gatherer(), "kscope_held_keys", g); v != 1 {
			t.Errorf("kscope_held_keys = %v while a key is held; want 1", v)
		}
		l := map[string]string{"consumer_group": group, "topic": keybreakercheck.Topic}
		if v, want := value(t, m.Gatherer(), "kscope_key_holds_total", l), float64(r.Stats().KeyBreaker.Holds); v < 3 || v != want {
			t.Errorf("kscope_key_holds_total = %v after two failed probes; want Stats.KeyBreaker.Holds (%v), at least 3", v, want)
		}
	}})
	if v := value(t, m.Gatherer(), "kscope_held_keys", g); v != 0 {
		t.Errorf("kscope_held_keys = %v once the key is released; want 0", v)
	}
}

// A record handled while the dedupe store did not answer (FailOpen)
// counts in kscope_dedupe_unavailable_total.
func TestDedupeUnavailableMetric(t *testing.T) {
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &kgo.Record{Topic: "payments"}
	m.OnRecordEvent(context.Background(), "g", rec, hook.EventDedupeUnavailable, "")
	m.OnRecordEvent(context.Background(), "g", rec, hook.EventDedupeUnavailable, "")
	if v := value(t, m.Gatherer(), "kscope_dedupe_unavailable_total", map[string]string{"consumer_group": "g", "topic": "payments"}); v != 2 {
		t.Errorf("kscope_dedupe_unavailable_total = %v; want 2", v)
	}
}

// Version gaps found and healed count in kscope_version_gaps_total{event}.
func TestVersionGapsMetric(t *testing.T) {
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &kgo.Record{Topic: "accounts"}
	for _, ev := range []hook.Event{hook.EventVersionGap, hook.EventVersionGap, hook.EventVersionHeal} {
		m.OnRecordEvent(context.Background(), "g", rec, ev, "")
	}
	for event, want := range map[string]float64{"found": 2, "healed": 1} {
		if v := value(t, m.Gatherer(), "kscope_version_gaps_total", map[string]string{"consumer_group": "g", "topic": "accounts", "event": event}); v != want {
			t.Errorf("kscope_version_gaps_total{event=%q} = %v; want %v", event, v, want)
		}
	}
}
