package consumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/hook"
)

type startHook struct{}

func (startHook) OnRecordStart(ctx context.Context, _ hook.RecordStart) context.Context { return ctx }
func (startHook) OnRecordEnd(context.Context, hook.RecordEnd)                           {}

// The AtLeastOnce scope calls a handler directly only when nothing wraps a
// handler call: each feature that does turns the direct path off.
func TestDirectCallsOnlyWithoutCallFeatures(t *testing.T) {
	base := func() Config {
		return Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, Logger: slog.New(slog.DiscardHandler)}
	}
	trips := func(error) bool { return true }
	for _, tc := range []struct {
		name   string
		change func(*Config)
		direct bool
	}{
		{"defaults", func(*Config) {}, true},
		{"a record hook", func(c *Config) { c.Hooks = []hook.Hook{startHook{}} }, false},
		{"Keep", func(c *Config) { c.Keep = func(*Record) bool { return true } }, false},
		{"MaxAge", func(c *Config) { c.MaxAge = time.Hour }, false},
		{"HandlerTimeout", func(c *Config) { c.HandlerTimeout = time.Second }, false},
		{"RateLimit", func(c *Config) { c.RateLimit.Records = Rate{PerSecond: 100} }, false},
		{"Breakers", func(c *Config) { c.Breakers = []BreakerConfig{{Name: "db", Trips: trips}} }, false},
		{"KeyBreaker", func(c *Config) { c.KeyBreaker = &KeyBreakerConfig{Trips: trips} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.change(&cfg)
			r, err := New(cfg, HandlerFunc(func(context.Context, *Record) error { return nil }))
			if err != nil {
				t.Fatal(err)
			}
			f := &failures{policy: r.cfg.Failures, group: r.cfg.Group, log: r.log, obs: r.obs, calls: newCallRules(r.cfg)}
			s := r.unit.(*atLeastOnce)
			s.bind(f)
			if s.direct != tc.direct {
				t.Fatalf("direct = %v, want %v", s.direct, tc.direct)
			}
		})
	}
}
