package txn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/engine"
)

// txnState is one transaction's bookkeeping, shared by the workers that
// join it.
type txnState struct {
	wg    sync.WaitGroup // produces not acknowledged yet
	mu    sync.Mutex
	err   error // the first produce or routing failure: the transaction aborts
	ends  []delivery
	first time.Time // when the first worker joined
	joins int       // input records joined
	counters
}

// delivery is an observed delivery that ends when the transaction does.
type delivery struct {
	rec *consumer.Record
	out consumer.Outcome
	err error
}

// end notes how rec's delivery ends if the transaction commits.
func (t *txnState) end(obs engine.Observer, rec *consumer.Record, out consumer.Outcome, err error) {
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
			d.out = consumer.OutcomeAborted
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

// gate lets the key-shard workers add finished records to the open
// transaction, and the poll loop end it while none is adding. A worker
// joins only once its record is finished: a record that retries in place
// waits between its attempts outside any transaction, so it holds its
// key-shard and nothing else.
type gate struct {
	mu     sync.Mutex
	cond   sync.Cond
	tx     *txnState // the open transaction; nil while one ends
	joined int       // workers adding to tx
	closed bool
	kick   func() // wakes the poll loop
	max    int    // input records after which the transaction ends early
}

func newGate(maxRecords int) *gate {
	g := &gate{max: maxRecords}
	g.cond.L = &g.mu
	return g
}

// join waits for an open transaction and returns it, or nil when the
// runner stops or the work of epoch of p is stale (its partition was
// rewound or revoked). The caller adds its outputs and calls leave.
func (g *gate) join(p *partState, epoch uint64) *txnState {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.tx == nil && !g.closed {
		g.cond.Wait()
	}
	if g.closed || !p.current(epoch) {
		return nil
	}
	g.joined++
	if g.tx.first.IsZero() {
		g.tx.first = time.Now()
		g.wake()
	}
	return g.tx
}

// leave ends a join; input says whether it added an input record.
func (g *gate) leave(tx *txnState, input bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.joined--
	if input {
		tx.joins++
		if tx.joins == g.max {
			g.wake()
		}
	}
	if g.joined == 0 {
		g.cond.Broadcast()
	}
}

func (g *gate) wake() {
	if g.kick != nil {
		g.kick()
	}
}

// setKick registers the function that wakes the poll loop.
func (g *gate) setKick(f func()) {
	g.mu.Lock()
	g.kick = f
	g.mu.Unlock()
}

// open makes tx the transaction workers join.
func (g *gate) open(tx *txnState) {
	g.mu.Lock()
	g.tx = tx
	g.cond.Broadcast()
	g.mu.Unlock()
}

// shut stops workers from joining the open transaction, waits for those
// adding to it, and returns it.
func (g *gate) shut() *txnState {
	g.mu.Lock()
	defer g.mu.Unlock()
	tx := g.tx
	g.tx = nil
	for g.joined > 0 {
		g.cond.Wait()
	}
	return tx
}

// close releases every worker waiting to join: nothing joins any more.
func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	g.tx = nil
	g.cond.Broadcast()
	g.mu.Unlock()
}

// endAt returns when the open transaction ends: CommitInterval after its
// first join, at once when it holds MaxRecords input records, or never
// (zero) while nothing joined it.
func (g *gate) endAt(interval time.Duration) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.tx == nil || g.tx.first.IsZero() {
		return time.Time{}
	}
	if g.tx.joins >= g.max {
		return g.tx.first
	}
	return g.tx.first.Add(interval)
}

// item is one unit of work for a key-shard worker: an input record, or a
// parked record whose gap timed out, of one epoch of its partition.
type item struct {
	part   *partState
	epoch  uint64
	rec    *consumer.Record
	expire *parkedRec
}

// work collects what handling one item adds to the transaction it joins:
// outputs, routed records, changelog records and state changes.
type work struct {
	part    *partState
	epoch   uint64
	fx      []func(tx *txnState)
	stopped bool // the runner stops or the item's epoch is stale: nothing joins
}

func (w *work) do(f func(tx *txnState)) { w.fx = append(w.fx, f) }

// stale reports whether the item is no longer wanted.
func (w *work) stale(ctx context.Context) bool {
	if ctx.Err() != nil || !w.part.current(w.epoch) {
		w.stopped = true
	}
	return w.stopped
}

// parts are the runner's assigned input partitions.
type parts struct {
	mu sync.Mutex
	m  map[tp]*partState
}

func (ps *parts) get(k tp) *partState {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.m[k]
}

func (ps *parts) all() []*partState {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]*partState, 0, len(ps.m))
	for _, p := range ps.m {
		out = append(out, p)
	}
	return out
}

// commitOffsets returns the context that ends a transaction: it commits,
// for every assigned partition, the offset at its lowest unfinished record
// and the finished records above it; and the function that installs them
// once the transaction committed.
func (ps *parts) commitOffsets(ctx context.Context) (context.Context, func()) {
	type point struct {
		p      *partState
		w, end int64
		meta   string
		undone []int64
	}
	var points []point
	for _, p := range ps.all() {
		w, meta, end, undone, changed := p.commitPoint()
		if changed {
			points = append(points, point{p, w, end, meta, undone})
		}
	}
	set := map[tp]point{}
	for _, pt := range points {
		set[tp{pt.p.topic, pt.p.partition}] = pt
	}
	ctx = kgo.PreTxnCommitFnContext(ctx, func(req *kmsg.TxnOffsetCommitRequest) error {
		seen := map[tp]bool{}
		topics := req.Topics[:0]
		for _, t := range req.Topics {
			parts := t.Partitions[:0]
			for _, rp := range t.Partitions {
				k := tp{t.Topic, rp.Partition}
				pt, ok := set[k]
				if !ok {
					continue // nothing of ours to commit: the session's head may lie past unfinished records
				}
				seen[k] = true
				rp.Offset, rp.LeaderEpoch, rp.Metadata = pt.w, -1, kmsg.StringPtr(pt.meta)
				parts = append(parts, rp)
			}
			if len(parts) > 0 {
				t.Partitions = parts
				topics = append(topics, t)
			}
		}
		req.Topics = topics
		for k, pt := range set {
			if seen[k] {
				continue
			}
			i := slices.IndexFunc(req.Topics, func(t kmsg.TxnOffsetCommitRequestTopic) bool { return t.Topic == k.topic })
			if i < 0 {
				t := kmsg.NewTxnOffsetCommitRequestTopic()
				t.Topic = k.topic
				req.Topics = append(req.Topics, t)
				i = len(req.Topics) - 1
			}
			rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = k.partition, pt.w, -1, kmsg.StringPtr(pt.meta)
			req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
		}
		return nil
	})
	return ctx, func() {
		for _, pt := range points {
			pt.p.committed(pt.w, pt.end, pt.undone)
		}
	}
}

// rewind rewinds every assigned partition to its committed state after an
// abort.
func (ps *parts) rewind(cl *kgo.Client) {
	set := map[string]map[int32]kgo.EpochOffset{}
	for _, p := range ps.all() {
		if o, ok := p.rewind(); ok {
			if set[p.topic] == nil {
				set[p.topic] = map[int32]kgo.EpochOffset{}
			}
			set[p.topic][p.partition] = kgo.EpochOffset{Epoch: -1, Offset: o}
		}
	}
	if len(set) > 0 {
		cl.SetOffsets(set)
	}
}
