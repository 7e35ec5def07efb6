package kscopeprom_test

import (
	"testing"
	"time"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/kscopeprom"
)

// A circuit breaker's state shows as kscope_breaker_state{breaker} (0
// closed, 1 half-open, 2 open), and each change counts in
// kscope_breaker_transitions_total{breaker,state}.
func TestBreakerMetrics(t *testing.T) {
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"consumer_group": "g", "breaker": "ledger"}
	for _, step := range []struct {
		state string
		want  float64
	}{{"open", 2}, {"half-open", 1}, {"open", 2}, {"half-open", 1}, {"closed", 0}} {
		m.OnBreaker(hook.Breaker{Group: "g", Name: "ledger", State: step.state, Since: time.Now()})
		if v := value(t, m.Gatherer(), "kscope_breaker_state", labels); v != step.want {
			t.Fatalf("kscope_breaker_state = %v after %s; want %v", v, step.state, step.want)
		}
	}
	for state, want := range map[string]float64{"open": 2, "half-open": 2, "closed": 1} {
		l := map[string]string{"consumer_group": "g", "breaker": "ledger", "state": state}
		if v := value(t, m.Gatherer(), "kscope_breaker_transitions_total", l); v != want {
			t.Errorf("kscope_breaker_transitions_total{state=%q} = %v; want %v", state, v, want)
		}
	}
}
