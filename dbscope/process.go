package dbscope

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/scope"
)

// failure is what is known of one record's failures in this Process call.
type failure struct {
	attempts int
	first    time.Time
}

// result is what one transaction decided for one record.
type result struct {
	out       outcome
	gap       gapNote
	gapDetail string          // the versions, for the version-gap event
	skipped   int64           // the versions a gap it was applied over skipped
	err       error           // failedOutcome: the handler's error; skipped: a note on lost writes
	step      retrytopic.Step // failedOutcome: what the failure policy decided
	st        inboxStatus     // rerouteOutcome: the outcome to route again
	release   bool            // the record was its key's head: the key's waiting records are released
}

// Process implements scope.Scope. The batch runs in rounds on the
// runner's retry loop (scope.Failures.Rounds): each round is one
// transaction over the records still pending, then what it decided is
// carried out; see batchRun.round.
func (s *dbScope) Process(ctx context.Context, batch []*consumer.Record, done func(*consumer.Record)) {
	obs := s.obs
	for _, r := range batch {
		obs.Start(ctx, r)
	}
	defer func() {
		for _, r := range batch {
			obs.End(r, hook.OutcomeAborted, nil) // a no-op for the records that ended
		}
	}()
	b := &batchRun{s: s, ctx: ctx, done: done, pending: batch, limit: s.txLimit(len(batch)),
		fails: map[*consumer.Record]*failure{}}
	if s.qh != nil {
		b.calls = make(map[*consumer.Record]*queuedCall, len(batch))
	}
	s.f.Rounds(ctx, done, b.round)
}

// batchRun is one Process call's state across its rounds.
type batchRun struct {
	s       *dbScope
	ctx     context.Context
	done    func(*consumer.Record)
	pending []*consumer.Record // in order; the next transaction takes pending[:limit]
	limit   int
	fails   map[*consumer.Record]*failure    // the failures of each record so far
	calls   map[*consumer.Record]*queuedCall // a QueueHandler's calls, kept for a retry of the transaction
}

// round runs one transaction over the pending records and carries out
// what it decided. When the transaction did not commit, the round failed:
// the same records go again after the loop's backoff, up to the record
// whose statement failed, when a transient error names one. When it
// committed, a parked record is stored in PostgreSQL and done; a failed
// one is retried in place (kept, after the policy's delay), sent to a
// retry topic or dead-lettered, and done once the broker has it; a key
// whose head resolved has its waiting records released. A record that
// failed transiently (a statement timeout, a deadlock) stopped the
// transaction: the records before it committed, and it goes again, with
// the rest, after the loop's backoff, which grows only while the same
// record fails first (a batch whose records time out one by one is not
// slowed down more and more).
func (b *batchRun) round() round {
	s, ctx, pending := b.s, b.ctx, b.pending
	if ctx.Err() != nil || pending[0].Revoked() {
		return round{Stop: true}
	}
	work, res, stop, err := s.apply(ctx, pending[:b.limit], b.done, b.fails, b.calls)
	if err != nil {
		if ctx.Err() != nil {
			return round{Stop: true}
		}
		s.txRetries.Add(1)
		var te *transientError
		if errors.As(err, &te) {
			delete(b.calls, te.rec) // its statement failed: its handler runs again
			if cut := slices.Index(pending[:b.limit], te.rec); cut > 0 {
				b.limit = cut
			}
		}
		return round{More: true, Of: pending[0], Err: err, Held: s.deployment(err)}
	}
	rest := pending[b.limit:] // after a transient failure: not tried yet
	kept, wait, release, ok := s.settle(ctx, work, res, b.fails, b.calls, b.done)
	if !ok {
		return round{Stop: true}
	}
	for _, k := range release {
		if err := s.release(ctx, k.topic, k.key); err != nil {
			return round{Stop: true}
		}
	}
	next := round{Wait: wait}
	if stop != nil {
		delete(b.calls, stop.rec) // its next attempt calls the handler again
		s.txRetries.Add(1)
		next.Err, next.Progress, next.Held = stop, stop.rec != pending[0], s.deployment(stop)
	}
	if len(kept) == 0 && len(rest) == 0 {
		return next
	}
	// What is left goes again, in order: the records kept for a retry in
	// place, those deferred behind them and those the transaction did not
	// reach, with the rest of the batch behind them.
	b.pending = append(kept, rest...)
	b.limit = s.txLimit(len(b.pending))
	next.More, next.Of = true, b.pending[0]
	return next
}

// heldKey names a key whose waiting records may be released.
type heldKey struct {
	topic string
	key   []byte
}

// settle carries out what a committed transaction decided for the records
// that did not apply: a parked record is stored in PostgreSQL and done; a
// failed one is retried in place (kept, after wait), sent to a retry topic
// or dead-lettered, and done once the broker has it; a held one (its key's
// circuit breaker opened) is stored in PostgreSQL and done. It returns
// the keys whose head resolved, to release their waiting records. ok is
// false when ctx ended while routing.
func (s *dbScope) settle(ctx context.Context, work []*consumer.Record, res []result, fails map[*consumer.Record]*failure, calls map[*consumer.Record]*queuedCall, done func(*consumer.Record)) (kept []*consumer.Record, wait time.Duration, release []heldKey, ok bool) {
	obs := s.obs
	for i, r := range work {
		if res[i].release {
			release = append(release, heldKey{s.f.Metadata(r).OriginalTopic, r.Key})
		}
		switch res[i].out {
		case parkedOutcome:
			obs.End(r, hook.OutcomeParked, nil)
			done(r)
		case heldOutcome:
			delete(calls, r) // released later from the waiting table, a delivery of its own
			obs.End(r, hook.OutcomeHeld, res[i].err)
			done(r)
		case rerouteOutcome:
			dead, err := s.reroute(ctx, r, res[i].st)
			if err != nil {
				return nil, 0, nil, false
			}
			if dead && r.Key != nil && s.honours() {
				release = append(release, heldKey{s.f.Metadata(r).OriginalTopic, r.Key})
			}
			obs.Event(r, hook.EventDuplicate, hook.DuplicateInbox)
			obs.End(r, hook.OutcomeDuplicate, nil)
			done(r)
		case failedOutcome:
			delete(calls, r) // its next attempt calls the handler again
			step, routed, err := s.routeFailed(ctx, r, res[i], fails)
			if err != nil {
				return nil, 0, nil, false // ctx done while routing: not done, redelivered
			}
			if routed != nil {
				release = append(release, *routed)
			}
			if step.Action != retrytopic.ActionRetry {
				done(r)
				continue
			}
			kept = append(kept, r)
			if wait == 0 || step.Delay < wait {
				wait = step.Delay
			}
		case deferred, notTried:
			kept = append(kept, r)
		}
	}
	return kept, wait, release, true
}

// routeFailed routes failed record r by its step and, unless it retries
// in place, ends its delivery. A dead-lettered record is remembered by the
// inbox, and its key (returned) has its waiting records released.
func (s *dbScope) routeFailed(ctx context.Context, r *consumer.Record, res result, fails map[*consumer.Record]*failure) (retrytopic.Step, *heldKey, error) {
	fi := fails[r]
	if fi == nil {
		fi = &failure{first: time.Now()}
		fails[r] = fi
	}
	fi.attempts++
	step := res.step
	if err := s.f.Route(ctx, r, res.err, step, fi.attempts, fi.first); err != nil {
		return step, nil, err
	}
	var release *heldKey
	if step.Action == retrytopic.ActionDeadLetter {
		meta := s.f.Metadata(r)
		if err := s.markDead(ctx, s.identity.Of(r), meta.OriginalTopic, r.Key); err != nil {
			return step, nil, err
		}
		if r.Key != nil && s.honours() {
			release = &heldKey{meta.OriginalTopic, r.Key}
		}
	}
	if step.Action != retrytopic.ActionRetry {
		out := scope.OutcomeOf(step.Action)
		if g := res.gap; (g == gapDetected || g == gapWaiting) && step.Action == retrytopic.ActionRetryTopic {
			out = hook.OutcomeGap
		}
		s.obs.End(r, out, res.err)
	}
	return step, release, nil
}

// txLimit returns how many of n pending records the next transaction
// takes: all of them for a QueueHandler, at most maxSavepoints for a
// Handler, each of whose records may take a savepoint. (Records left out
// would have their inbox rows inserted and deleted again.)
func (s *dbScope) txLimit(n int) int {
	if s.qh == nil && s.bh == nil {
		return min(n, maxSavepoints)
	}
	return n
}

// apply runs one transaction over recs and calls done for every record it
// made durable (applied, skipped or found duplicate), in order. It returns
// the records it worked on with what it decided for each, and the
// transient error, if any, that ended the transaction early (the records
// before it committed; it and those after it were not tried). A non-nil
// error means the transaction did not commit.
func (s *dbScope) apply(ctx context.Context, recs []*consumer.Record, done func(*consumer.Record), fails map[*consumer.Record]*failure, calls map[*consumer.Record]*queuedCall) ([]*consumer.Record, []result, *transientError, error) {
	work := recs[:0:0]
	if s.o.StoreOffsets {
		for _, r := range recs {
			if m, ok := s.mark(r); ok && r.Offset < m {
				s.replaySkipped.Add(1)
				s.obs.Event(r, hook.EventDuplicate, hook.DuplicateInbox)
				s.obs.End(r, hook.OutcomeDuplicate, nil)
				done(r)
				continue
			}
			work = append(work, r)
		}
	} else {
		work = recs
	}
	if len(work) == 0 {
		return nil, nil, nil, nil
	}
	ids := make([]string, len(work))
	for i, r := range work {
		ids[i] = s.identity.Of(r)
	}
	// A statement that fails where no savepoint of its record undoes it
	// (a queued one, a first one that cannot be prepared) aborts the
	// transaction: it runs again without that record's statements, each
	// of which fails its record. A COMMIT that fails on a deferred
	// constraint (an integrity violation) runs again over the records up
	// to the middle one of those that wrote, and so on, until one record
	// wrote, which then fails with the violation. The records before it
	// commit first, so the record that fails is the first whose writes
	// break the constraint after those of the records before it, as if
	// the constraints were checked after each record. (A transaction over
	// fewer records leaves the rest notTried, for the next one.)
	var known map[int]error
	single := false // a batch handler's records, one call each
	lim := len(work)
	var res []result
	var stop *transientError
	var err error
	for again := true; again; {
		res, stop, err = s.runTx(ctx, work[:lim], ids[:lim], fails, calls, known, single)
		var ie *isolateError
		var cv *commitViolation
		switch {
		case errors.As(err, &ie) && known[ie.i] == nil:
			known = withKnown(known, ie.i, ie.err)
		case errors.As(err, &cv) && len(cv.wrote) == 1:
			known = withKnown(known, cv.wrote[0], cv)
		case errors.As(err, &cv) && len(cv.wrote) > 1:
			lim = cv.wrote[len(cv.wrote)/2]
		case errors.Is(err, errIsolateBatch) && !single:
			single = true
		default:
			again = false
		}
	}
	if err != nil {
		return nil, nil, nil, err
	}
	for range work[lim:] {
		res = append(res, result{out: notTried})
	}
	s.transactions.Add(1)
	s.account(work, res, done)
	return work, res, stop, nil
}

// withKnown returns known, made if nil, with record i failing with err.
func withKnown(known map[int]error, i int, err error) map[int]error {
	if known == nil {
		known = make(map[int]error)
	}
	known[i] = err
	return known
}

// account counts and reports what a committed transaction did to each
// record, and ends the deliveries of those done (applied, skipped,
// duplicate, stale).
func (s *dbScope) account(work []*consumer.Record, res []result, done func(*consumer.Record)) {
	obs := s.obs
	for i, r := range work {
		switch res[i].gap {
		case gapDetected, gapAccepted, gapDead, gapFilled:
			obs.Event(r, hook.EventVersionGap, res[i].gapDetail)
		case gapHealed:
			obs.Event(r, hook.EventVersionHeal, "")
		}
		switch res[i].out {
		case applied:
			s.applied.Add(1)
			obs.End(r, hook.OutcomeSuccess, nil)
			done(r)
		case skipped:
			s.skipped.Add(1)
			if res[i].err != nil {
				s.log.Warn("kscope: record skipped without its writes", "err", res[i].err,
					"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "id", s.identity.Of(r))
			}
			obs.End(r, hook.OutcomeSkipped, res[i].err)
			done(r)
		case duplicate:
			s.duplicates.Add(1)
			obs.Event(r, hook.EventDuplicate, hook.DuplicateInbox)
			obs.End(r, hook.OutcomeDuplicate, nil)
			done(r)
		case staleOutcome:
			s.stale.Add(1)
			obs.End(r, hook.OutcomeStale, nil)
			done(r)
		case failedOutcome, heldOutcome:
			s.failed.Add(1)
		case parkedOutcome:
			s.parked.Add(1)
		}
		if res[i].out == applied || res[i].out == skipped || (res[i].gap != gapFilled && res[i].gap != gapAccepted) {
			// A gap filled or accepted counts once its record is applied.
			s.countGap(res[i].gap)
			s.versionsSkipped.Add(res[i].skipped)
		}
	}
}
