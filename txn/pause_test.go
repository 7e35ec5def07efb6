package txn_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/pausecheck"
	"github.com/kscope-dev/kscope/internal/ratecheck"
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

// In the Kafka scope, a rate limit of 200 records a second holds within
// 5% without a busy loop (internal/ratecheck: over 20 s on Apache Kafka,
// 3 s on kfake; the producer lingers for the commit interval under the
// limit, so a transaction's outputs go in a few produce requests); the
// waits hold the open transaction, which still commits: each committed
// input has its output once.
func TestRateLimitKafkaScope(t *testing.T) {
	k := setup(t)
	var r *txn.Runner
	ratecheck.Run(t, k, config(k, "g-kafka-rate"), func(cfg consumer.Config, handled func()) (*consumer.Runner, error) {
		var err error
		r, err = txn.New(cfg, txn.Options{TransactionalID: "kafka-rate-1"}, txn.HandlerFunc(func(ctx context.Context, rec *consumer.Record, out txn.Emitter) error {
			handled()
			return echoToOut(ctx, rec, out)
		}))
		if err != nil {
			return nil, err
		}
		return r.Runner, nil
	})
	committed := r.Stats().Kafka.Records
	outs := map[string]int{}
	for _, rec := range k.ReadAll(t, "out") {
		outs[string(rec.Value)]++
	}
	if committed == 0 || int64(len(outs)) != committed {
		t.Errorf("%d distinct outputs for %d committed inputs; want one each", len(outs), committed)
	}
	for v, n := range outs {
		if n > 1 {
			t.Errorf("output %s committed %d times; want once", v, n)
		}
	}
}
