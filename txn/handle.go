package txn

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/dlreason"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
)

// handle runs rec on its key-shard worker and, once it is finished, adds
// what it produced to the open transaction and reports it done. It
// reports false when rec was left undone: the runner stops, or rec's
// assignment ended (its next owner, or this member after an abort's
// rewind, handles it again).
func (s *kafkaScope) handle(ctx context.Context, rec *consumer.Record, done func(*consumer.Record)) bool {
	return s.handleIn(ctx, rec, done, s.guardPart(rec), nil)
}

// handleIn is handle with the guard's state of rec's partition (nil
// without Options.Dedupe, or for a record of no input: a retry topic's),
// which Process looks up once per batch, and rec's key in it when
// Process computed it (nil: not).
func (s *kafkaScope) handleIn(ctx context.Context, rec *consumer.Record, done func(*consumer.Record), pv *partVersions, id *idKey) bool {
	w := &work{rec: rec}
	if w.stale(ctx) {
		return false
	}
	obs := s.obs
	if s.o.Versions != nil && rec.Key != nil {
		s.handleVersioned(ctx, w, rec, done)
	} else {
		hctx := w.start(ctx, obs, rec)
		var g guardRef
		if pv != nil {
			var dup bool
			if g, dup = s.duplicate(w, rec, pv, id); dup {
				return s.join(ctx, w, done)
			}
		}
		out, err := s.run(ctx, hctx, w, rec, done)
		switch out {
		case hook.OutcomeAborted:
			obs.End(rec, out, err)
			return false
		case hook.OutcomeHeld:
			obs.End(rec, out, err)
			return true // the runner keeps it, and gives it back at its key's probe
		}
		if out == hook.OutcomeSuccess && g.pv != nil {
			w.remember = g // in the transaction w joins
		}
		w.do(func(tx *txnState) {
			tx.records.Add(1)
			tx.end(obs, rec, out, err)
		})
	}
	return s.join(ctx, w, done)
}

// join adds w to the open transaction, once one is open, and reports the
// input record (if w has one: done is not nil) done in it. When w cannot
// join, the deliveries it started end as aborted.
func (s *kafkaScope) join(ctx context.Context, w *work, done func(*consumer.Record)) bool {
	if w.stopped || w.stale(ctx) || !s.gate.join(w.rec) {
		w.drop(s.obs)
		return false
	}
	tx := s.cur
	for _, fx := range w.fx {
		fx(tx)
	}
	if g := w.remember; g.pv != nil {
		tx.remembered.Add(1)
		g.pv.rememberID(g.id)
	}
	if done != nil {
		done(w.rec)
	}
	s.gate.leave(done != nil)
	return true
}

// run runs rec's handler with in-place retries (the failure policy's
// Attempts, as in every scope) and collects its outputs, or its route,
// into w. hctx is the handler's context. The waits between attempts hold
// the record's key-shard, not a transaction. It returns the delivery's
// outcome (success, skipped, retried, dead_lettered, or aborted when the
// runner stops or the record is no longer wanted) and the last handler
// error.
func (s *kafkaScope) run(ctx, hctx context.Context, w *work, rec *consumer.Record, done func(*consumer.Record)) (hook.Outcome, error) {
	if herr := s.unwritableOf(rec); herr != nil {
		// An earlier transaction aborted because a record this input
		// produced can never be written: the input fails, as Terminal.
		key := keyOf(rec)
		w.do(func(tx *txnState) { tx.cleared = append(tx.cleared, key) })
		return s.failed(ctx, w, rec, herr, s.f.Decide(ctx, rec, herr, 1, false), 1, time.Now())
	}
	var em *emitter
	a := s.f.Attempts(ctx, rec, s.UsesRetryTopics(), done, func() error {
		em = &emitter{}
		return s.eng.Call(hctx, rec, func(ctx context.Context) error {
			if gap, ok := sequence.FromContext(ctx); ok && gap.Outcome == sequence.Gap && s.o.FillGap != nil {
				if err := s.o.FillGap(ctx, rec, gap, em); err != nil {
					return fmt.Errorf("txn: Options.FillGap, for versions %d to %d: %w", gap.Expected(), gap.Version-1, err)
				}
			}
			return s.h.Handle(ctx, rec, em)
		})
	})
	err, step, attempt, first := a.Err, a.Step, a.N, a.First
	if a.Held {
		return hook.OutcomeHeld, err
	}
	if !a.OK || w.stale(ctx) {
		return hook.OutcomeAborted, err
	}
	if err != nil {
		return s.failed(ctx, w, rec, err, step, attempt, first)
	}
	for _, out := range em.out {
		if n := recordBytes(out); n > s.limit {
			herr := consumer.Terminal(fmt.Errorf("kscope: an output to %s takes at least %d bytes, more than the producer writes in a record batch "+
				"(%d bytes: kgo.ProducerBatchMaxBytes, or kgo.MaxBufferedBytes, in Config.ClientOptions): %w", out.Topic, n, s.limit, kerr.MessageTooLarge))
			if first.IsZero() {
				first = time.Now()
			}
			return s.failed(ctx, w, rec, herr, s.f.Decide(ctx, rec, herr, attempt, false), attempt, first)
		}
	}
	for _, out := range em.out {
		s.obs.Inject(hctx, out)
		w.do(func(tx *txnState) {
			tx.outputs.Add(1)
			tx.produce(ctx, s.sess, out, rec, producedOutput, func() string {
				return fmt.Sprintf("an output of %s[%d]@%d", rec.Topic, rec.Partition, rec.Offset)
			}, s.limit, nil)
		})
	}
	return hook.OutcomeSuccess, nil
}

// failed carries out step for rec, whose handling failed with err: a
// skip, a retry topic or the dead-letter topic, in the transaction w
// joins.
func (s *kafkaScope) failed(ctx context.Context, w *work, rec *consumer.Record, err error, step retrytopic.Step, attempt int, first time.Time) (hook.Outcome, error) {
	switch step.Action {
	case retrytopic.ActionSkip:
		s.f.Route(ctx, rec, err, step, attempt, first) //nolint:errcheck // logs and counts only
		w.do(func(tx *txnState) { tx.skipped.Add(1) })
		return hook.OutcomeSkipped, err
	case retrytopic.ActionRetryTopic:
		// The retry record joins the transaction: it becomes visible
		// exactly when the input's offset commits.
		out := s.f.RetryTopicRecord(rec, err, step, attempt, first)
		s.route(ctx, w, rec, out, hook.Route{Kind: "retry", Class: step.Class.String()})
		w.do(func(tx *txnState) { tx.retryTopic.Add(1) })
		s.obs.Event(rec, hook.EventRetryTopic, out.Topic)
		s.log.LogAttrs(ctx, slog.LevelWarn, "kscope: record sent to a retry topic (in the transaction)",
			append(append(s.recordAttrs(rec), slog.String("retry_topic", out.Topic), slog.Duration("delay", step.Delay), slog.Any("err", err)), s.f.PanicStack(rec, err)...)...)
		return hook.OutcomeRetried, err
	default:
		s.deadLetter(ctx, w, rec, err, step, attempt, first)
		return hook.OutcomeDeadLettered, err
	}
}

// deadLetter adds rec's dead-letter record to w: it becomes visible
// exactly when the input's offset commits.
func (s *kafkaScope) deadLetter(ctx context.Context, w *work, rec *consumer.Record, err error, step retrytopic.Step, attempt int, first time.Time) {
	dl := s.f.DeadLetterRecord(rec, err, step, attempt, first)
	reason := dlreason.Of(err, step.Class)
	s.route(ctx, w, rec, dl, hook.Route{Kind: "dlt", Class: step.Class.String(), Reason: reason})
	w.do(func(tx *txnState) { tx.dead.Add(1) })
	s.obs.Event(rec, hook.EventDeadLetter, dl.Topic)
	s.dltLog.Log(ctx, s.log, slog.LevelError, "kscope: record sent to the dead-letter topic (in the transaction)", "records sent to the dead-letter topic",
		append(append(s.recordAttrs(rec), slog.String("class", step.Class.String()), slog.String("reason", reason), slog.Any("err", err)), s.f.PanicStack(rec, err)...)...)
}

// route adds a retry or dead-letter record to w; rt (its Kind, Class and
// Reason) is reported to the hooks once it is produced.
func (s *kafkaScope) route(ctx context.Context, w *work, rec *consumer.Record, out *kgo.Record, rt hook.Route) {
	obs := s.obs
	as := producedRoute
	if rt.Kind == "dlt" {
		as = producedDead
	}
	kind := rt.Kind
	what := func() string {
		return fmt.Sprintf("the %s record of %s[%d]@%d", kind, rec.Topic, rec.Partition, rec.Offset)
	}
	rt.Topic, rt.Target = rec.Topic, out.Topic
	w.do(func(tx *txnState) {
		tx.produce(ctx, s.sess, out, rec, as, what, s.limit, func(err error) {
			rt.Err = err
			obs.Route(rt)
		})
	})
}

// handleVersioned checks rec's version against its key's last applied one
// and applies, skips, parks or dead-letters it. The key's state changes
// when w joins a transaction; until then only this key-shard's worker
// reads it.
func (s *kafkaScope) handleVersioned(ctx context.Context, w *work, rec *consumer.Record, done func(*consumer.Record)) {
	vers := s.vs.cfg
	f, obs := s.f, s.obs
	hctx := w.start(ctx, obs, rec)
	now := time.Now()
	ended := func(out hook.Outcome, err error) {
		w.do(func(tx *txnState) {
			tx.records.Add(1)
			tx.end(obs, rec, out, err)
		})
	}
	v, err := vers.Version(rec)
	if err != nil {
		herr := consumer.DecodeError(err) // poison: the DLT, with the reason
		s.deadLetter(ctx, w, rec, herr, f.Decide(ctx, rec, herr, 1, false), 1, now)
		ended(hook.OutcomeDeadLettered, herr)
		return
	}
	pv := s.vs.get(tp{rec.Topic, rec.Partition})
	if pv == nil {
		w.stopped = true // no longer assigned to this member
		obs.End(rec, hook.OutcomeAborted, nil)
		return
	}
	key := string(rec.Key)
	last, known := pv.lastOf(key)
	check := vers.Check(v, last, known)
	switch {
	case check.Outcome == sequence.Stale:
		w.do(func(tx *txnState) { tx.stale.Add(1) })
		ended(hook.OutcomeStale, nil)
		return
	case check.Outcome == sequence.Gap && s.o.FillGap != nil:
		obs.Event(rec, hook.EventVersionGap, (&retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}).Error())
		// Its handler's call fills it first (run).
	case check.Outcome == sequence.Gap && vers.Gaps == sequence.DeadLetter:
		gap := &retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}
		obs.Event(rec, hook.EventVersionGap, gap.Error())
		herr := consumer.Terminal(gap)
		s.deadLetter(ctx, w, rec, herr, f.Decide(ctx, rec, herr, 1, false), 1, now)
		ended(hook.OutcomeDeadLettered, herr)
		return
	case check.Outcome == sequence.Gap && vers.Gaps == sequence.Wait:
		obs.Event(rec, hook.EventVersionGap, (&retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}).Error())
		s.parkGap(ctx, w, rec, pv, v, now, ended)
		return
	case check.Outcome == sequence.Gap:
		obs.Event(rec, hook.EventVersionGap, (&retrytopic.VersionGapError{Expected: check.Expected(), Actual: v}).Error())
	}
	out, herr := s.run(ctx, sequence.WithResult(hctx, check), w, rec, done)
	if out == hook.OutcomeAborted {
		obs.End(rec, out, herr)
		return
	}
	ended(out, herr)
	if out != hook.OutcomeSuccess && out != hook.OutcomeSkipped {
		return // dead-lettered: the key's version stays
	}
	switch {
	case check.Outcome == sequence.Gap && s.o.FillGap != nil:
		w.do(func(tx *txnState) { tx.gapsFilled.Add(1) })
	case check.Outcome == sequence.Gap:
		skipped := check.Version - check.Expected()
		w.do(func(tx *txnState) {
			tx.gapsAccepted.Add(1)
			tx.versionsSkipped.Add(skipped)
		})
	}
	s.advance(ctx, w, pv, rec, v)
	s.releaseParked(ctx, w, pv, rec, v)
}

// advance records v as the last applied version of rec's key.
func (s *kafkaScope) advance(ctx context.Context, w *work, pv *partVersions, rec *consumer.Record, v int64) {
	key := string(rec.Key)
	w.do(func(*txnState) { pv.setLast(key, v) })
	s.changelog(ctx, w, rec.Topic, rec.Partition, append([]byte{kindVersion}, rec.Key...), []byte(strconv.FormatInt(v, 10)))
}

// releaseParked applies the parked records of rec's key that follow v, in
// version order, in the transaction rec joins. Of the records parked with
// one version, the first that is applied (or skipped) applies it and the
// rest are stale; a dead-lettered one leaves the version to the next.
func (s *kafkaScope) releaseParked(ctx context.Context, w *work, pv *partVersions, rec *consumer.Record, v int64) {
	key := string(rec.Key)
	for {
		p := pv.parkedAt(key, v+1)
		if p == nil {
			return
		}
		applied, aborted := s.applyParked(ctx, w, pv, p, sequence.Result{Outcome: sequence.Applied, Version: v + 1, Last: v})
		if aborted || applied == nil {
			return // stopped, or dead-lettered: the key's version stays
		}
		v++
		s.advance(ctx, w, pv, applied.record(), v)
	}
}

// applyParked runs the records parked with version check.Version (p and
// those parked with it), in the transaction w joins, and unparks them: the
// first that is applied (or skipped) applies the version (applied), the
// rest are stale. aborted: the runner stops or the record is no longer
// wanted, and nothing of it is unparked. A check of outcome Gap applies
// the version over the gap (sequence.TimeoutAccept).
func (s *kafkaScope) applyParked(ctx context.Context, w *work, pv *partVersions, p *parkedRec, check sequence.Result) (applied *parkedRec, aborted bool) {
	obs := s.obs
	for _, c := range p.all() {
		pr := c.record()
		hctx := w.start(ctx, obs, pr)
		if applied != nil {
			w.do(func(tx *txnState) {
				tx.stale.Add(1)
				tx.end(obs, pr, hook.OutcomeStale, nil)
			})
			continue
		}
		if check.Outcome == sequence.Applied {
			obs.Event(pr, hook.EventVersionHeal, "")
		}
		out, herr := s.run(ctx, sequence.WithResult(hctx, check), w, pr, nil)
		if out == hook.OutcomeAborted {
			obs.End(pr, out, herr)
			return nil, true
		}
		w.do(func(tx *txnState) { tx.end(obs, pr, out, herr) })
		if out == hook.OutcomeSuccess || out == hook.OutcomeSkipped {
			applied = c
			if check.Outcome == sequence.Applied {
				w.do(func(tx *txnState) { tx.gapsHealed.Add(1) })
			} else {
				skipped := check.Version - check.Expected()
				w.do(func(tx *txnState) {
					tx.gapsAccepted.Add(1)
					tx.versionsSkipped.Add(skipped)
				})
			}
		}
	}
	s.unpark(ctx, w, pv, p)
	return applied, false
}

// expire sends a parked record that waited past GapTimeout, and the
// records parked with it, to the DLT, on its key-shard's worker (rec is
// the synthetic record its task runs for, of its partition's current
// assignment).
func (s *kafkaScope) expire(ctx context.Context, rec *consumer.Record, p *parkedRec) {
	defer s.vs.expiring(p, false)
	w := &work{rec: rec}
	pv := s.vs.get(tp{p.Topic, p.Partition})
	if pv == nil || w.stale(ctx) {
		return
	}
	key := string(p.Key)
	cur := pv.parkedAt(key, p.Version) // p, or p with the records parked with it since
	if cur == nil || !cur.Since.Equal(p.Since) {
		return // released meanwhile
	}
	last, _ := pv.lastOf(key)
	if s.o.Versions.OnTimeout == sequence.TimeoutAccept {
		// Wait, then accept: the key's lowest parked version is applied
		// over the gap, and those that follow it in turn.
		low := pv.lowestParked(key)
		check := sequence.Result{Outcome: sequence.Gap, Version: low.Version, Last: last}
		if applied, aborted := s.applyParked(ctx, w, pv, low, check); !aborted && applied != nil {
			s.advance(ctx, w, pv, applied.record(), low.Version)
			s.releaseParked(ctx, w, pv, applied.record(), low.Version)
		}
		s.join(ctx, w, nil)
		return
	}
	obs := s.obs
	for _, c := range cur.all() {
		pr := c.record()
		w.start(ctx, obs, pr)
		herr := consumer.Terminal(&retrytopic.VersionGapError{Expected: last + 1, Actual: c.Version})
		step := s.f.Decide(ctx, pr, herr, 1, false)
		s.deadLetter(ctx, w, pr, herr, step, 1, c.Since)
		w.do(func(tx *txnState) {
			tx.timedOut.Add(1)
			tx.end(obs, pr, hook.OutcomeDeadLettered, herr)
		})
	}
	s.unpark(ctx, w, pv, cur)
	s.join(ctx, w, nil)
}

// unparkable returns why rec cannot be parked (as the changelog record
// with value val), or nil: an earlier transaction aborted because that
// changelog record was refused, or it is larger than the producer writes.
func (s *kafkaScope) unparkable(rec *consumer.Record, val []byte) error {
	if err := s.unwritableOf(rec); err != nil {
		return err
	}
	if n := recordBytes(&kgo.Record{Key: rec.Key, Value: val}); n > s.limit {
		return consumer.Terminal(fmt.Errorf("kscope: the record waits for a version gap to heal, but its changelog record takes at least %d bytes, "+
			"more than the producer writes in a record batch (%d bytes: kgo.ProducerBatchMaxBytes, or kgo.MaxBufferedBytes, in Config.ClientOptions): %w",
			n, s.limit, kerr.MessageTooLarge))
	}
	return nil
}

func (s *kafkaScope) unpark(ctx context.Context, w *work, pv *partVersions, p *parkedRec) {
	key := string(p.Key)
	w.do(func(*txnState) { pv.setParked(key, p.Version, nil) })
	s.changelog(ctx, w, p.Topic, p.Partition, parkedKey(p.Key, p.Version), nil)
}

// changelog adds one changelog record to w, to the partition of the input
// partition it belongs to.
func (s *kafkaScope) changelog(ctx context.Context, w *work, topic string, p int32, key, value []byte) {
	rec := changelogRecord(s.cfg.Group, topic, p, key, value)
	input := w.rec
	w.do(func(tx *txnState) {
		tx.produce(ctx, s.sess, rec, input, producedChangelog, func() string { return "a version changelog record" }, s.limit, nil)
	})
}

// changelogRecord is a record of the changelog of input partition p of
// topic.
func changelogRecord(group, topic string, p int32, key, value []byte) *kgo.Record {
	return &kgo.Record{Topic: VersionsTopic(group, topic), Partition: p, Key: key, Value: value}
}

// parkGap parks rec, whose version v is ahead of its key's next one, until
// the gap heals (Gaps: sequence.Wait): its changelog record joins the
// transaction w joins. A redelivery of a parked record stays parked as it
// was; a record with the version of a parked one waits with it. A record
// whose changelog record can never be written goes to the dead-letter
// topic instead. ended ends the delivery in the transaction.
func (s *kafkaScope) parkGap(ctx context.Context, w *work, rec *consumer.Record, pv *partVersions, v int64, now time.Time, ended func(hook.Outcome, error)) {
	obs, key := s.obs, string(rec.Key)
	parked := pv.parkedAt(key, v)
	if parked != nil && parked.holds(rec, s.cfg.Identity) {
		ended(hook.OutcomeGap, nil) // a redelivery of a parked record stays parked as it was
		return
	}
	p := &parkedRec{Version: v, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Timestamp: rec.Timestamp,
		Key: rec.Key, Value: rec.Value, Headers: rec.Headers, Since: now}
	stored := p
	if parked != nil {
		// Another record with the version of a parked one: it waits
		// with it, and ends stale, applied in its place, or
		// dead-lettered with it.
		stored = parked.with(p)
		s.log.Warn("kscope: a record has the version of a parked record of its key; it waits with it",
			"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "id", s.cfg.Identity.Of(rec), "version", v,
			"parked", fmt.Sprintf("%s[%d]@%d", parked.Topic, parked.Partition, parked.Offset))
	}
	val, err := json.Marshal(stored)
	if err != nil {
		err = fmt.Errorf("encoding the parked record of %s[%d]@%d: %w", rec.Topic, rec.Partition, rec.Offset, err)
		w.do(func(tx *txnState) {
			tx.fail(err)
			tx.end(obs, rec, hook.OutcomeAborted, err)
		})
		return
	}
	if herr := s.unparkable(rec, val); herr != nil {
		// Its changelog record can never be written: the record
		// cannot wait for its gap to heal and goes to the DLT, as
		// with Gaps: sequence.DeadLetter.
		s.deadLetter(ctx, w, rec, herr, s.f.Decide(ctx, rec, herr, 1, false), 1, now)
		ended(hook.OutcomeDeadLettered, herr)
		return
	}
	w.do(func(tx *txnState) {
		pv.setParked(key, v, stored)
		tx.gapsDetected.Add(1)
	})
	s.changelog(ctx, w, rec.Topic, rec.Partition, parkedKey(rec.Key, v), val)
	ended(hook.OutcomeGap, nil)
}
