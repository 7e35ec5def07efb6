package consumer_test

import (
	"context"
	"testing"

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
