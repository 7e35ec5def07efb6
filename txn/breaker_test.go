package txn_test

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/breakercheck"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// In the Kafka scope, a dependency's breaker opens after its failures,
// pauses fetching, routes nothing while open, probes, and closes when the
// dependency recovers: every record's output is committed once, though
// its handler emitted it in calls that failed while the breaker was open.
func TestBreakerKafkaScope(t *testing.T) {
	k := testenv.KafkaT(t)
	const out = "bc-out"
	if err := k.CreateTopic(context.Background(), out, 1); err != nil {
		t.Fatal(err)
	}
	breakercheck.Run(t, k, "g-kafka-breaker", func(cfg consumer.Config, dep *breakercheck.Dep) (*consumer.Runner, error) {
		cfg.ClientOptions = clientOpts()
		r, err := txn.New(cfg, txn.Options{TransactionalID: "kafka-breaker-1"}, txn.HandlerFunc(func(_ context.Context, r *consumer.Record, em txn.Emitter) error {
			em.Emit(&kgo.Record{Topic: out, Key: r.Key, Value: r.Value})
			return dep.Call(r) // after an output: a failure drops it
		}))
		if err != nil {
			return nil, err
		}
		return r.Runner, nil
	})
	seen := map[string]int{}
	for _, r := range k.ReadAll(t, out) {
		seen[string(r.Value)]++
	}
	if len(seen) != breakercheck.Keys*breakercheck.PerKey {
		t.Errorf("%d distinct outputs; want %d", len(seen), breakercheck.Keys*breakercheck.PerKey)
	}
	for v, n := range seen {
		if n != 1 {
			t.Errorf("output %s committed %d times; want once", v, n)
		}
	}
}
