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
	"github.com/kscope-dev/kscope/internal/kafkaerr"
)

// txnState is one transaction's bookkeeping, shared by the workers that
// join it.
type txnState struct {
	wg   sync.WaitGroup // produces not acknowledged yet
	mu   sync.Mutex
	err  error // the first produce or routing failure: the transaction aborts
	ends []delivery
	// unwritable are the records of this transaction the broker refused
	// as records (kafkaerr.Refused), by the input they belong to.
	unwritable []refusal
	// cleared are the inputs dead-lettered in this transaction for an
	// unwritable record of theirs: forgotten once it commits.
	cleared []recKey
	counters
}

// recKey identifies an input record across its redeliveries.
type recKey struct {
	topic     string
	partition int32
	offset    int64
}

func keyOf(rec *consumer.Record) recKey { return recKey{rec.Topic, rec.Partition, rec.Offset} }

// produced is what a record produced in a transaction is for.
type produced int

const (
	producedOutput    produced = iota // a handler's output
	producedRoute                     // a retry-topic record
	producedChangelog                 // a version changelog record
	producedDead                      // a dead-letter record
)

// refusal is one record of a transaction that the broker, or the client,
// refused as a record: it can never be written, however often the
// transaction is retried.
type refusal struct {
	input recKey // the input record it belongs to
	what  string
	topic string
	kind  produced
	// alone: the record cannot have failed for other records' sake (too
	// large on its own, or a topic name the broker rejects).
	alone bool
	err   error
}

// delivery is an observed delivery that ends when the transaction does.
type delivery struct {
	rec *consumer.Record
	out hook.Outcome
	err error
}

// end notes how rec's delivery ends if the transaction commits.
func (t *txnState) end(obs observer, rec *consumer.Record, out hook.Outcome, err error) {
	if obs.Ended(rec) {
		return
	}
	t.mu.Lock()
	t.ends = append(t.ends, delivery{rec, out, err})
	t.mu.Unlock()
}

// finish ends the transaction's observed deliveries.
func (t *txnState) finish(obs observer, committed bool) {
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

// produce adds rec, which input's handling produced (input is nil for
// none) as kind, to the transaction; a failure aborts it, and its error
// names the record as describe says (called only then). done, when not
// nil, is told every record's result.
func (t *txnState) produce(ctx context.Context, sess *kgo.GroupTransactSession, rec *kgo.Record, input *consumer.Record, kind produced, describe func() string, limit int64, done func(error)) {
	t.wg.Add(1)
	sess.Produce(ctx, rec, func(_ *kgo.Record, err error) {
		if done != nil {
			done(err)
		}
		if err != nil {
			what := describe()
			err = produceError(rec.Topic, what, err)
			t.fail(err)
			if kafkaerr.Refused(err) && input != nil && input.Offset >= 0 {
				alone := errors.Is(err, kerr.InvalidTopicException) || recordBytes(rec) > limit
				t.mu.Lock()
				t.unwritable = append(t.unwritable, refusal{input: keyOf(input), what: what, topic: rec.Topic, kind: kind, alone: alone, err: err})
				t.mu.Unlock()
			}
		}
		t.wg.Done()
	})
}

// recordBytes is a lower bound of what rec takes in a record batch of its
// own (kgo refuses a record whose batch would exceed
// kgo.ProducerBatchMaxBytes): its key, value and headers and the batch's
// 61-byte header.
func recordBytes(rec *kgo.Record) int64 {
	n := len(rec.Key) + len(rec.Value) + 61 + 7
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value) + 2
	}
	return int64(n)
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
	rec *consumer.Record // the input record, or the synthetic one of a scheduled expiry
	fx  []func(tx *txnState)
	// started are the deliveries begun for this work (the input's, and
	// those of the parked records it releases or expires): those its
	// transaction does not take end as aborted.
	started []*consumer.Record
	stopped bool // the runner stops or the record's assignment ended: nothing joins
	// remember is the identity the guard remembers in the transaction
	// this work joins (Options.Dedupe; pv nil: none).
	remember guardRef
}

func (w *work) do(f func(tx *txnState)) { w.fx = append(w.fx, f) }

// start begins a delivery of rec (obs.Start) that ends with this work.
// Without record hooks nothing starts, and nothing is kept.
func (w *work) start(ctx context.Context, obs observer, rec *consumer.Record) context.Context {
	ctx = obs.Start(ctx, rec)
	if !obs.Ended(rec) {
		w.started = append(w.started, rec)
	}
	return ctx
}

// drop ends, as aborted, the deliveries of this work that have not
// ended: nothing of it joins a transaction.
func (w *work) drop(obs observer) {
	for _, rec := range w.started {
		if !obs.Ended(rec) {
			obs.End(rec, hook.OutcomeAborted, nil)
		}
	}
}

// stale reports whether the record is no longer wanted.
func (w *work) stale(ctx context.Context) bool {
	if ctx.Err() != nil || w.rec.Revoked() {
		w.stopped = true
	}
	return w.stopped
}
