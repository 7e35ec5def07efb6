package txn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/engine"
	"github.com/kscope-dev/kscope/internal/guard"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
)

// handle runs one work item on its key-shard worker and, once it is
// finished, adds what it produced to the open transaction.
func (r *Runner) handle(ctx context.Context, sess *kgo.GroupTransactSession, f engine.Failures, g *gate, it item) {
	w := &work{part: it.part, epoch: it.epoch}
	if w.stale(ctx) {
		return
	}
	obs := engine.ObserverOf(f)
	switch {
	case it.expire != nil:
		r.expire(ctx, sess, f, w, it.expire)
	case r.vs != nil && it.rec.Key != nil:
		r.handleVersioned(ctx, sess, f, w, it.rec)
	default:
		hctx := obs.Start(ctx, it.rec)
		out, err := r.run(ctx, hctx, sess, f, w, it.rec)
		if out == consumer.OutcomeAborted {
			obs.End(it.rec, out, err)
			return
		}
		w.do(func(tx *txnState) {
			tx.records.Add(1)
			tx.end(obs, it.rec, out, err)
		})
	}
	if w.stopped {
		return
	}
	tx := g.join(it.part, it.epoch)
	if tx == nil {
		if it.rec != nil {
			obs.End(it.rec, consumer.OutcomeAborted, nil)
		}
		return
	}
	for _, fx := range w.fx {
		fx(tx)
	}
	if it.rec != nil {
		it.part.done(it.epoch, it.rec.Offset)
	}
	g.leave(tx, it.rec != nil)
}

// run runs rec's handler with in-place retries and collects its outputs,
// or its route, into w. hctx is the handler's context. The waits between
// attempts hold the record's key-shard, not a transaction. It returns the
// delivery's outcome (success, skipped, retried, dead_lettered, or aborted
// when the runner stops or the record is no longer wanted) and the last
// handler error.
func (r *Runner) run(ctx, hctx context.Context, sess *kgo.GroupTransactSession, f engine.Failures, w *work, rec *consumer.Record) (consumer.Outcome, error) {
	var first time.Time
	obs := engine.ObserverOf(f)
	for attempt := 1; ; attempt++ {
		if w.stale(ctx) {
			return consumer.OutcomeAborted, nil
		}
		em := &emitter{}
		err := callHandler(hctx, r.h, rec, em)
		if err == nil {
			for _, out := range em.out {
				obs.Inject(hctx, out)
				what := fmt.Sprintf("an output of %s[%d]@%d", rec.Topic, rec.Partition, rec.Offset)
				w.do(func(tx *txnState) {
					tx.outputs.Add(1)
					tx.produce(ctx, sess, out, what)
				})
			}
			return consumer.OutcomeSuccess, nil
		}
		if w.stale(ctx) {
			return consumer.OutcomeAborted, err
		}
		if first.IsZero() {
			first = time.Now()
		}
		step := f.Decide(ctx, rec, err, attempt, r.retryTopics())
		switch step.Action {
		case retrytopic.ActionRetry:
			f.Route(ctx, rec, err, step, attempt, first) //nolint:errcheck // logs and counts only
			if !backoff.Sleep(w.part.a.Context(), step.Delay) {
				return consumer.OutcomeAborted, err
			}
			continue
		case retrytopic.ActionSkip:
			f.Route(ctx, rec, err, step, attempt, first) //nolint:errcheck // logs and counts only
			w.do(func(tx *txnState) { tx.skipped.Add(1) })
			return consumer.OutcomeSkipped, err
		case retrytopic.ActionRetryTopic:
			// The retry record joins the transaction: it becomes visible
			// exactly when the input's offset commits.
			out := f.RetryTopicRecord(rec, err, step, attempt, first)
			r.route(ctx, sess, f, w, rec, out, "retry", step.Class.String())
			w.do(func(tx *txnState) { tx.retryTopic.Add(1) })
			obs.Event(rec, consumer.EventRetryTopic, out.Topic)
			r.log.Warn("kscope: record sent to a retry topic (in the transaction)",
				"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "retry_topic", out.Topic, "delay", step.Delay, "err", err)
			return consumer.OutcomeRetried, err
		default:
			r.deadLetter(ctx, sess, f, w, rec, err, step, attempt, first)
			return consumer.OutcomeDeadLettered, err
		}
	}
}

// deadLetter adds rec's dead-letter record to w: it becomes visible
// exactly when the input's offset commits.
func (r *Runner) deadLetter(ctx context.Context, sess *kgo.GroupTransactSession, f engine.Failures, w *work, rec *consumer.Record, err error, step retrytopic.Step, attempt int, first time.Time) {
	dl := f.DeadLetterRecord(rec, err, step, attempt, first)
	r.route(ctx, sess, f, w, rec, dl, "dlt", step.Class.String())
	w.do(func(tx *txnState) { tx.dead.Add(1) })
	engine.ObserverOf(f).Event(rec, consumer.EventDeadLetter, dl.Topic)
	r.dltLog.Log(ctx, r.log, slog.LevelError, "kscope: record sent to the dead-letter topic (in the transaction)", "records sent to the dead-letter topic",
		slog.String("topic", rec.Topic), slog.Int("partition", int(rec.Partition)), slog.Int64("offset", rec.Offset), slog.String("class", step.Class.String()), slog.Any("err", err))
}

// route adds a retry or dead-letter record to w.
func (r *Runner) route(ctx context.Context, sess *kgo.GroupTransactSession, f engine.Failures, w *work, rec *consumer.Record, out *kgo.Record, kind, class string) {
	obs := engine.ObserverOf(f)
	w.do(func(tx *txnState) {
		tx.wg.Add(1)
		sess.Produce(ctx, out, func(_ *kgo.Record, err error) {
			obs.Route(consumer.Route{Topic: rec.Topic, Kind: kind, Class: class, Target: out.Topic, Err: err})
			if err != nil {
				tx.fail(produceError(out.Topic, fmt.Sprintf("the %s record of %s[%d]@%d", kind, rec.Topic, rec.Partition, rec.Offset), err))
			}
			tx.wg.Done()
		})
	})
}

// handleVersioned checks rec's version against its key's last applied one
// and applies, skips, parks or dead-letters it. The key's state changes
// when w joins a transaction; until then only this key-shard's worker
// reads it.
func (r *Runner) handleVersioned(ctx context.Context, sess *kgo.GroupTransactSession, f engine.Failures, w *work, rec *consumer.Record) {
	vers := r.vs.cfg
	obs := engine.ObserverOf(f)
	hctx := obs.Start(ctx, rec)
	now := time.Now()
	ended := func(out consumer.Outcome, err error) {
		w.do(func(tx *txnState) {
			tx.records.Add(1)
			tx.end(obs, rec, out, err)
		})
	}
	v, err := vers.Version(rec)
	if err != nil {
		herr := consumer.DecodeError(err) // poison: the DLT, with the reason
		r.deadLetter(ctx, sess, f, w, rec, herr, f.Decide(ctx, rec, herr, 1, false), 1, now)
		ended(consumer.OutcomeDeadLettered, herr)
		return
	}
	pv := r.vs.get(tp{rec.Topic, rec.Partition})
	if pv == nil {
		w.stopped = true // no longer assigned to this member
		obs.End(rec, consumer.OutcomeAborted, nil)
		return
	}
	key := string(rec.Key)
	last, known := pv.lastOf(key)
	check := vers.Check(v, last, known)
	switch {
	case check.Outcome == sequence.Stale:
		w.do(func(tx *txnState) { tx.stale.Add(1) })
		ended(consumer.OutcomeStale, nil)
		return
	case check.Outcome == sequence.Gap && vers.Gaps == sequence.DeadLetter:
		gap := &retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}
		obs.Event(rec, consumer.EventVersionGap, gap.Error())
		herr := consumer.Terminal(gap)
		r.deadLetter(ctx, sess, f, w, rec, herr, f.Decide(ctx, rec, herr, 1, false), 1, now)
		ended(consumer.OutcomeDeadLettered, herr)
		return
	case check.Outcome == sequence.Gap && vers.Gaps == sequence.Wait:
		obs.Event(rec, consumer.EventVersionGap, (&retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}).Error())
		if pv.parkedAt(key, v) == nil { // a redelivery of a parked record stays parked as it was
			p := &parkedRec{Version: v, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Timestamp: rec.Timestamp,
				Key: rec.Key, Value: rec.Value, Headers: rec.Headers, Since: now}
			val, err := json.Marshal(p)
			if err != nil {
				w.do(func(tx *txnState) {
					tx.fail(fmt.Errorf("encoding the parked record of %s[%d]@%d: %w", rec.Topic, rec.Partition, rec.Offset, err))
				})
				return
			}
			w.do(func(tx *txnState) {
				pv.setParked(key, v, p)
				tx.gapsDetected.Add(1)
			})
			r.changelog(ctx, sess, w, rec.Topic, rec.Partition, parkedKey(rec.Key, v), val)
		}
		ended(consumer.OutcomeGap, nil)
		return
	case check.Outcome == sequence.Gap:
		obs.Event(rec, consumer.EventVersionGap, (&retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}).Error())
	}
	out, herr := r.run(ctx, sequence.WithResult(hctx, check), sess, f, w, rec)
	if out == consumer.OutcomeAborted {
		obs.End(rec, out, herr)
		return
	}
	ended(out, herr)
	if out != consumer.OutcomeSuccess && out != consumer.OutcomeSkipped {
		return // dead-lettered: the key's version stays
	}
	if check.Outcome == sequence.Gap {
		w.do(func(tx *txnState) { tx.gapsAccepted.Add(1) })
	}
	r.advance(ctx, sess, w, pv, rec, v)
	r.releaseParked(ctx, sess, f, w, pv, rec, v)
}

// advance records v as the last applied version of rec's key.
func (r *Runner) advance(ctx context.Context, sess *kgo.GroupTransactSession, w *work, pv *partVersions, rec *consumer.Record, v int64) {
	key := string(rec.Key)
	w.do(func(*txnState) { pv.setLast(key, v) })
	r.changelog(ctx, sess, w, rec.Topic, rec.Partition, append([]byte{kindVersion}, rec.Key...), []byte(strconv.FormatInt(v, 10)))
}

// releaseParked applies the parked records of rec's key that follow v, in
// version order, in the transaction rec joins.
func (r *Runner) releaseParked(ctx context.Context, sess *kgo.GroupTransactSession, f engine.Failures, w *work, pv *partVersions, rec *consumer.Record, v int64) {
	key := string(rec.Key)
	for {
		p := pv.parkedAt(key, v+1)
		if p == nil {
			return
		}
		pr := p.record()
		obs := engine.ObserverOf(f)
		hctx := obs.Start(ctx, pr)
		obs.Event(pr, consumer.EventVersionHeal, "")
		check := sequence.Result{Outcome: sequence.Applied, Version: v + 1, Last: v}
		out, herr := r.run(ctx, sequence.WithResult(hctx, check), sess, f, w, pr)
		if out == consumer.OutcomeAborted {
			obs.End(pr, out, herr)
			return
		}
		r.unpark(ctx, sess, w, pv, p)
		w.do(func(tx *txnState) { tx.end(obs, pr, out, herr) })
		if out != consumer.OutcomeSuccess && out != consumer.OutcomeSkipped {
			return
		}
		w.do(func(tx *txnState) { tx.gapsHealed.Add(1) })
		v++
		r.advance(ctx, sess, w, pv, pr, v)
	}
}

// expire sends a parked record that waited past GapTimeout to the DLT.
func (r *Runner) expire(ctx context.Context, sess *kgo.GroupTransactSession, f engine.Failures, w *work, p *parkedRec) {
	defer r.vs.expiring(p, false)
	pv := r.vs.get(tp{p.Topic, p.Partition})
	if pv == nil {
		w.stopped = true
		return
	}
	key := string(p.Key)
	if pv.parkedAt(key, p.Version) == nil {
		w.stopped = true // released meanwhile
		return
	}
	last, _ := pv.lastOf(key)
	rec := p.record()
	obs := engine.ObserverOf(f)
	obs.Start(ctx, rec)
	herr := consumer.Terminal(&retrytopic.VersionGapError{Expected: last + 1, Actual: p.Version})
	step := f.Decide(ctx, rec, herr, 1, false)
	r.deadLetter(ctx, sess, f, w, rec, herr, step, 1, p.Since)
	r.unpark(ctx, sess, w, pv, p)
	w.do(func(tx *txnState) {
		tx.timedOut.Add(1)
		tx.end(obs, rec, consumer.OutcomeDeadLettered, herr)
	})
}

func (r *Runner) unpark(ctx context.Context, sess *kgo.GroupTransactSession, w *work, pv *partVersions, p *parkedRec) {
	key := string(p.Key)
	w.do(func(*txnState) { pv.setParked(key, p.Version, nil) })
	r.changelog(ctx, sess, w, p.Topic, p.Partition, parkedKey(p.Key, p.Version), nil)
}

// changelog adds one changelog record to w, to the partition of the input
// partition it belongs to.
func (r *Runner) changelog(ctx context.Context, sess *kgo.GroupTransactSession, w *work, topic string, p int32, key, value []byte) {
	rec := &kgo.Record{Topic: VersionsTopic(r.cfg.Group, topic), Partition: p, Key: key, Value: value}
	w.do(func(tx *txnState) { tx.produce(ctx, sess, rec, "a version changelog record") })
}
func callHandler(ctx context.Context, h Handler, r *consumer.Record, out Emitter) error {
	return guard.Call(func() error { return h.Handle(ctx, r, out) })
}

var errAborted = errors.New("kscope: the transaction aborted; its offsets did not commit")

func count(ps map[string][]int32) int {
	n := 0
	for _, p := range ps {
		n += len(p)
	}
	return n
}
