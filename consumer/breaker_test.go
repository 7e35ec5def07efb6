package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/breakercheck"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// In the AtLeastOnce scope, a dependency's breaker opens after its
// failures, pauses fetching, routes nothing while open, probes, closes
// when the dependency recovers, and every record is served once in key
// order.
func TestBreakerAtLeastOnce(t *testing.T) {
	k := testenv.KafkaT(t)
	breakercheck.Run(t, k, "g-breaker", func(cfg consumer.Config, dep *breakercheck.Dep) (*consumer.Runner, error) {
		return consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error { return dep.Call(r) }))
	})
}

// A breaker without a name or a Trips, named twice, or with a negative
// count or duration fails New with a sentence naming the field.
func TestBreakerConfigErrors(t *testing.T) {
	trips := func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }
	nop := consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil })
	cases := []struct {
		name     string
		breakers []consumer.BreakerConfig
		field    string
		says     string
	}{
		{"no name", []consumer.BreakerConfig{{Trips: trips}}, "Breakers[0].Name", "name the breaker's dependency"},
		{"same name", []consumer.BreakerConfig{{Name: "db", Trips: trips}, {Name: "db", Trips: trips}}, "Breakers[1].Name", "give each breaker its own name"},
		{"no trips", []consumer.BreakerConfig{{Name: "db"}}, "Breakers[0].Trips", "reports whether a handler error is a failure of the dependency"},
		{"negative failures", []consumer.BreakerConfig{{Name: "db", Trips: trips, Failures: -1}}, "Breakers[0].Failures", "0 selects 5"},
		{"negative window", []consumer.BreakerConfig{{Name: "db", Trips: trips, Window: -time.Second}}, "Breakers[0].Window", "positive duration"},
		{"negative open-for", []consumer.BreakerConfig{{Name: "db", Trips: trips, OpenFor: -time.Second}}, "Breakers[0].OpenFor", "positive duration"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}, Breakers: tc.breakers}
			r, err := consumer.New(cfg, nop)
			if err == nil {
				r.Close()
				t.Fatal("New accepted a bad breaker")
			}
			var ce *consumer.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %q; want field %s saying %q", err, tc.field, tc.says)
			}
		})
	}
	r, err := consumer.New(consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"},
		Breakers: []consumer.BreakerConfig{{Name: "db", Trips: trips}}}, nop)
	if err != nil {
		t.Fatalf("a breaker with its defaults: %v", err)
	}
	defer r.Close()
	if st := r.Stats().Breakers; len(st) != 0 && (st[0].Name != "db" || st[0].State != consumer.BreakerClosed) {
		t.Errorf("Stats.Breakers %+v before Run; want db closed, or none yet", st)
	}
}
