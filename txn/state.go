package txn

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/engine"
)

// txnState is one transaction's bookkeeping, shared by the workers that
// join it.
type txnState struct {
	wg   sync.WaitGroup // produces not acknowledged yet
	mu   sync.Mutex
	err  error // the first produce or routing failure: the transaction aborts
	ends []delivery
	counters
}

// delivery is an observed delivery that ends when the transaction does.
type delivery struct {
	rec *consumer.Record
	out hook.Outcome
	err error
}

// end notes how rec's delivery ends if the transaction commits.
func (t *txnState) end(obs engine.Observer, rec *consumer.Record, out hook.Outcome, err error) {
	if obs.Ended(rec) {
		return
	}
	t.mu.Lock()
	t.ends = append(t.ends, delivery{rec, out, err})
	t.mu.Unlock()
}

// finish ends the transaction's observed deliveries.
func (t *txnState) finish(obs engine.Observer, committed bool) {
	for _, d := range t.ends {
		if !committed {
			d.out = hook.OutcomeAborted
		}
		obs.End(d.rec, d.out, d.err)
	}
}

func (t *txnState) fail(err error) {
	t.mu.Lock()
	if t.err == nil {
		t.err = err
	}
	t.mu.Unlock()
}

func (t *txnState) failed() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// produce adds rec to the transaction; a failure aborts it.
func (t *txnState) produce(ctx context.Context, sess *kgo.GroupTransactSession, rec *kgo.Record, what string) {
	t.wg.Add(1)
	sess.Produce(ctx, rec, func(_ *kgo.Record, err error) {
		if err != nil {
			t.fail(produceError(rec.Topic, what, err))
		}
		t.wg.Done()
	})
}

// produceError describes the failure to produce what to topic, naming the
// topic and what to do when it does not exist.
func produceError(topic, what string, err error) error {
	if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) {
		return fmt.Errorf("output topic %s does not exist (producing %s): create it, or enable automatic topic creation "+
			"(auto.create.topics.enable on the broker and kgo.AllowAutoTopicCreation() in Config.ClientOptions): %w", topic, what, err)
	}
	return fmt.Errorf("producing %s to %s: %w", what, topic, err)
}

// work collects what handling one record adds to the transaction it
// joins: outputs, routed records, changelog records and state changes.
type work struct {
	rec     *consumer.Record // the input record, or the synthetic one of a scheduled expiry
	fx      []func(tx *txnState)
	stopped bool // the runner stops or the record's assignment ended: nothing joins
}

func (w *work) do(f func(tx *txnState)) { w.fx = append(w.fx, f) }

// stale reports whether the record is no longer wanted.
func (w *work) stale(ctx context.Context) bool {
	if ctx.Err() != nil || w.rec.Revoked() {
		w.stopped = true
	}
	return w.stopped
}
