package txn_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/pausecheck"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// In the Kafka scope, a topic paused while its records flow is not
// handled until it is resumed, the other topic goes on, and a rebalance
// (which aborts the open transaction) keeps it paused.
func TestPauseTopicKafkaScope(t *testing.T) {
	k := testenv.KafkaT(t)
	var member atomic.Int32
	pausecheck.Run(t, k, "g-kafka-pause", func(cfg consumer.Config) (*consumer.Runner, error) {
		cfg.ClientOptions = clientOpts()
		id := fmt.Sprintf("kafka-pause-%d", member.Add(1))
		r, err := txn.New(cfg, txn.Options{TransactionalID: id}, txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error { return nil }))
		if err != nil {
			return nil, err
		}
		return r.Runner, nil
	})
}

// In the Kafka scope, a rate limit paces the handler calls; the waits hold
// the open transaction, which still commits.
func TestRateLimitKafkaScope(t *testing.T) {
	k := setup(t)
	var recs []*kgo.Record
	for i := range 40 {
		recs = append(recs, &kgo.Record{Topic: "in", Key: fmt.Appendf(nil, "k%d", i%5), Value: fmt.Appendf(nil, "v%d", i)})
	}
	if err := k.Produce(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	cfg := config(k, "g-kafka-rate")
	cfg.RateLimit = consumer.RateLimit{Records: consumer.Rate{PerSecond: 100}}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "kafka-rate-1"}, txn.HandlerFunc(echoToOut))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop := runFor(t, r)
	testenv.WaitFor(t, time.Minute, "every input's output committed", func() bool { return r.Stats().Kafka.Records == 40 })
	if took := time.Since(start); took < 390*time.Millisecond {
		t.Errorf("40 records at 100 a second took %s; want at least 390ms", took)
	}
	if st := r.Stats().RateLimit; st.Waits == 0 {
		t.Errorf("Stats.RateLimit %+v; want waits", st)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := len(k.ReadAll(t, "out")); n != 40 {
		t.Fatalf("%d outputs; want 40, each once", n)
	}
}
