package dbscope

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/scope"
	"github.com/kscope-dev/kscope/sequence"
)

// release applies the waiting records of key (of original topic topic)
// from PostgreSQL, in arrival order, in transactions of at most
// maxSavepoints records, until none is left or one of them fails and
// becomes the key's new head (it goes to the retry topics or the DLT; the
// rest stay behind it). It does nothing while the key has a head, and ends
// when it meets a waiting record marked as the key's head: one that
// another release is routing, or that a release left mid-route (a stopped
// process, a lost partition), which recoverParking routes again. No round
// of it runs again at once unless the one before applied records.
//
// While it routes a record that became the head, the record's row is
// marked in s.inRoute, so that the periodic recovery leaves it alone; a
// routing that ctx cuts short is left to that recovery. A deferred
// constraint that the records applied in a transaction broke is traced to
// the first record whose writes break it, which fails with the violation
// and becomes the head, as in a batch (scope.apply).
func (s *dbScope) release(ctx context.Context, topic string, key []byte) error {
	return s.releaseKey(ctx, topic, key, nil)
}

// releaseKey is release; with p, the release of a held key whose probe is
// due (see probeHeld): its first transaction takes the key's held row and
// runs the first waiting record as the key's probe.
func (s *dbScope) releaseKey(ctx context.Context, topic string, key []byte, p *keyProbe) error {
	tries := map[string]int{}   // in-place attempts per identity
	known := map[string]error{} // failures that aborted an earlier try, per identity
	limit := maxSavepoints      // waiting records per transaction; fewer while a deferred constraint is traced
	dl := releaseDeliveries{}
	var marked []int64
	defer func() {
		for _, seq := range marked {
			s.inRoute.remove(seq)
		}
		// A delivery whose outcome no committed transaction decided
		// (ctx ended, or a transaction that ran again stopped before
		// it): the record stays waiting, for a later release.
		for _, r := range dl {
			s.obs.End(r, hook.OutcomeAborted, nil)
		}
	}()
	var err error
	ok := s.f.Rounds(ctx, nil, func() round {
		var rel released
		if err = s.retryTx(ctx, func(tx pgx.Tx) error {
			var err error
			rel, err = s.releaseTx(ctx, tx, topic, key, tries, known, dl, limit, p)
			if err == nil && rel.routed != nil {
				// Marked before the commit that makes it a head row.
				s.inRoute.add(rel.routed.seq)
				marked = append(marked, rel.routed.seq)
			}
			return err
		}); err != nil {
			if !traceViolation(err, &limit, known) {
				return round{Stop: true}
			}
			err = nil
			return round{More: true}
		}
		limit = maxSavepoints
		if p != nil {
			p.settled = true
		}
		s.count(&rel)
		s.endReleased(&rel)
		if rt := rel.retry; rt != nil {
			// A retry in place, logged and counted as in a batch (Route
			// only reports it); the delivery goes on in the next
			// transaction.
			_ = s.f.Route(ctx, rt.rec, rt.err, rt.step, rt.attempt, time.Now())
		}
		if rel.routed != nil {
			if err = s.routeReleased(ctx, &rel, topic, key, tries); err != nil {
				return round{Stop: true}
			}
			out := scope.OutcomeOf(rel.step.Action)
			if rel.routedGap && rel.step.Action == retrytopic.ActionRetryTopic {
				out = hook.OutcomeGap
			}
			s.obs.End(rel.routed.rec, out, rel.routedErr)
			// Past a dead letter, the next waiting record is the key's
			// head; one in the retry topics holds the key, unless new
			// failures do not park (it did not become the head).
			return round{More: rel.step.Action == retrytopic.ActionDeadLetter || !s.ordered()}
		}
		// A retry in place waits its delay; a full transaction may have
		// left more waiting records. A release that met the key's head
		// ends: another round would find the same head and change
		// nothing.
		// One that held the key again ends too: its probe is due later.
		return round{More: !rel.held && !rel.hold && (rel.wait > 0 || rel.n >= maxSavepoints), Wait: rel.wait}
	})
	if !ok && err == nil {
		err = ctx.Err()
	}
	return err
}

// traceViolation reports whether err, a release transaction's failure,
// is a deferred constraint that the records applied broke. Then the
// transaction runs again over those before the middle one of them (limit
// is lowered), until one record is left, which is put in known to fail
// with the violation (as in scope.apply).
func traceViolation(err error, limit *int, known map[string]error) bool {
	var cv *commitViolation
	if !errors.As(err, &cv) {
		return false
	}
	if len(cv.wrote) > 1 {
		*limit = cv.wrote[len(cv.wrote)/2]
	} else if len(cv.wrote) == 1 {
		known[cv.ids[0]] = cv
	}
	return true
}

// routeReleased routes the record that a committed release transaction
// made the key's head, to the retry topics or the DLT, and ends the
// routing of its waiting row once the broker has it.
func (s *dbScope) routeReleased(ctx context.Context, rel *released, topic string, key []byte, tries map[string]int) error {
	attempt := tries[rel.routed.id] + 1
	first := rel.first
	if first.IsZero() {
		first = time.Now()
	}
	if err := s.f.Route(ctx, rel.routed.rec, rel.routedErr, rel.step, attempt, first); err != nil {
		return err
	}
	return s.routedFromWaiting(ctx, rel.routed, topic, key, rel.step.Action == retrytopic.ActionDeadLetter)
}

// released is what one release transaction did.
type released struct {
	n         int             // waiting rows it read
	routed    *waitingRow     // the record that became the key's head, to route once it commits
	routedErr error           // its handler's error
	step      retrytopic.Step // its route
	wait      time.Duration   // the backoff before an in-place retry
	up        statusUpdates   // inbox rows to update
	done      []int64         // waiting rows to delete
	wrote     bool            // the last record released kept its handler's writes
	first     time.Time       // its first failure, when it is not now (a gap it waited for while stored)

	routedGap bool // routed for a version gap
	held      bool // it met the key's head, being routed or left mid-route: the release ends
	hold      bool // a record's failure held the key (consumer.Config.KeyBreaker): the release ends
	probe     *keyProbe

	// What it did, counted into the scope's counters and reported to the
	// hooks once it commits: a transaction that fails and runs again
	// counts its records again.
	applied, skipped, stale, failed int64
	gaps                            []releasedGap
	ends                            []releasedEnd // the deliveries it ended (the routed record's ends once routed)
	retry                           *releasedEnd  // a failure it retries in place
}

// releasedGap is a version gap a release transaction found.
type releasedGap struct {
	rec     *consumer.Record
	note    gapNote
	detail  string
	skipped int64 // the versions it was applied over
}

// releasedEnd is the outcome of a released record's delivery, or (step,
// attempt) a failed attempt it retries in place.
type releasedEnd struct {
	rec     *consumer.Record
	out     hook.Outcome
	err     error
	step    retrytopic.Step
	attempt int
}

// releaseDeliveries are the deliveries (hook.RecordHook) of the records
// one release runs, by identity. A released record's handler call is a
// delivery of its own, as in the Kafka scope: it starts the first time the
// release reaches the record, lasts across the transactions run again and
// the retries in place, and ends once the transaction that decided its
// outcome commits (or the record is routed).
type releaseDeliveries map[string]*consumer.Record

// count adds what a committed release transaction did to the scope's
// counters.
func (s *dbScope) count(rel *released) {
	s.applied.Add(rel.applied)
	s.skipped.Add(rel.skipped)
	s.stale.Add(rel.stale)
	s.failed.Add(rel.failed)
	for _, g := range rel.gaps {
		s.countGap(g.note)
		s.versionsSkipped.Add(g.skipped)
	}
}

// endReleased reports to the hooks what a committed release transaction
// did: the version gaps it found and the deliveries it ended.
func (s *dbScope) endReleased(rel *released) {
	for _, g := range rel.gaps {
		switch g.note {
		case gapDetected, gapAccepted, gapDead:
			s.obs.Event(g.rec, hook.EventVersionGap, g.detail)
		case gapHealed:
			s.obs.Event(g.rec, hook.EventVersionHeal, "")
		}
	}
	for _, e := range rel.ends {
		s.obs.End(e.rec, e.out, e.err)
	}
}

// releaseTx is one release transaction: under the key's lock, unless the
// key has a head, it applies the key's waiting records in order until one
// fails (it retries in place after rel.wait, or becomes the head). A
// record whose failure aborted the transaction before its savepoint is
// put in known, and the transaction fails: in the next one, that record
// fails with that error without its handler being called.
func (s *dbScope) releaseTx(ctx context.Context, tx pgx.Tx, topic string, key []byte, tries map[string]int, known map[string]error, dl releaseDeliveries, limit int, p *keyProbe) (rel released, err error) {
	if _, err := tx.Exec(ctx, s.sqlLockKeys, s.o.Consumer, []string{topic}, [][]byte{key}); err != nil {
		return rel, err
	}
	probe := false // the transaction took the key's held row: its first record is the probe
	if p != nil && !p.settled {
		if probe, err = s.takeProbe(ctx, tx, topic, key, p); err != nil {
			return rel, err
		}
	}
	rel.probe = p
	var heads int
	if err := tx.QueryRow(ctx, s.sqlCountHeads, s.o.Consumer, topic, key).Scan(&heads); err != nil || heads > 0 {
		return rel, err
	}
	rows, err := tx.Query(ctx, s.sqlLoadWaitingRows, s.o.Consumer, topic, key, limit)
	if err != nil {
		return rel, err
	}
	ws, err := scanWaiting(rows)
	if err != nil {
		return rel, err
	}
	rel.n = len(ws)
	rtx := &recordTx{tx: tx}
	var wrote []int // the records whose handler's writes the transaction holds
	for i := range ws {
		if ws[i].head {
			// Being routed by another release (of this process or
			// another), or left mid-route by one that stopped: it holds
			// the key. This release ends; the release routing it goes on
			// once the broker has it, and the recovery pass routes again
			// a head that nobody routes any more (recoverParking).
			rel.held = true
			break
		}
		if probe && i == 0 {
			s.markProbe(&ws[i], dl, p)
		}
		rel.wrote = false
		stop, err := s.releaseOne(ctx, tx, rtx, topic, key, &ws[i], tries, known, dl, &rel)
		if err != nil {
			return rel, err
		}
		if rel.wrote {
			wrote = append(wrote, i)
		}
		if stop {
			break
		}
	}
	if len(wrote) > 0 {
		// A deferred constraint (DEFERRABLE INITIALLY DEFERRED) that the
		// handlers' writes broke is checked here, after every record's
		// statements, rather than by COMMIT, so that it is known to be
		// one and traced to its record (see release).
		if _, err := tx.Exec(ctx, "SET CONSTRAINTS ALL IMMEDIATE"); err != nil {
			if deferredRefusal(err) {
				cv := &commitViolation{err: err, wrote: wrote}
				for _, i := range wrote {
					cv.ids = append(cv.ids, ws[i].id)
				}
				return rel, cv
			}
			return rel, err
		}
	}
	if len(rel.up.ids) > 0 {
		up := rel.up
		if _, err := tx.Exec(ctx, s.sqlSetStatus, s.o.Consumer, up.ids, up.statuses, up.attempts, up.stages, up.vias); err != nil {
			return rel, err
		}
	}
	if len(rel.done) > 0 {
		if _, err := tx.Exec(ctx, s.sqlDeleteWaiting, rel.done); err != nil {
			return rel, err
		}
	}
	return rel, nil
}

// releaseOne applies the waiting record w in a release transaction. stop
// reports that it failed: it retries in place, or it became the key's head.
func (s *dbScope) releaseOne(ctx context.Context, tx pgx.Tx, rtx *recordTx, topic string, key []byte, w *waitingRow, tries map[string]int, known map[string]error, dl releaseDeliveries, rel *released) (stop bool, err error) {
	r := w.rec
	if d, ok := dl[w.id]; ok {
		r, w.rec = d, d // the delivery started in an earlier transaction
	} else {
		s.obs.Start(ctx, r)
		dl[w.id] = r
	}
	hctx := s.obs.Context(ctx, r)
	herr := error(nil)
	var gapStep *retrytopic.Step // where a gap sends it, decided as for a record consumed
	if s.o.Versions != nil && w.version == 0 {
		// Stored by a deployment that did not check versions: its version
		// is read now, as for a record consumed. One that cannot be read
		// is poison.
		v, verr := s.o.Versions.Version(r)
		if verr != nil {
			herr = consumer.DecodeError(verr)
		}
		w.version = v
	}
	if s.o.Versions != nil && herr == nil {
		check, err := s.checkVersion(ctx, tx, topic, key, w.version)
		if err != nil {
			return true, err
		}
		switch {
		case check.Outcome == sequence.Stale:
			rel.up.add(w.id, statusApplied, 0, 0, "")
			rel.done = append(rel.done, w.seq)
			rel.stale++
			rel.ends = append(rel.ends, releasedEnd{rec: r, out: hook.OutcomeStale, err: nil})
			return false, nil
		case check.Outcome == sequence.Gap && s.o.FillGap != nil:
			rel.gaps = append(rel.gaps, releasedGap{r, gapFilled, "", 0}) // its handler's call fills it first
		case check.Outcome == sequence.Gap && s.o.Versions.Gaps != sequence.Accept && !s.acceptsLate(r, w):
			gapStep, herr = s.releaseGap(ctx, w, r, check, tries, rel)
		case check.Outcome == sequence.Gap:
			rel.gaps = append(rel.gaps, releasedGap{r, gapAccepted, "", check.Version - check.Expected()})
		}
		hctx = sequence.WithResult(hctx, check)
	}
	if herr == nil {
		herr = known[w.id]
		delete(known, w.id)
	}
	if herr == nil {
		herr = s.applyReleased(hctx, tx, rtx, r)
		if ie, ok := herr.(*isolateError); ok {
			known[w.id] = ie.err
			return true, ie
		}
	}
	if herr != nil && (s.transient(herr) || s.deployment(herr)) {
		return true, herr
	}
	if herr == nil || s.f.Class(herr) == consumer.ClassSkip {
		return s.releaseApplied(ctx, tx, topic, key, w, r, herr, rel)
	}
	return s.releaseFailed(ctx, tx, topic, key, w, r, herr, gapStep, tries, rel)
}

// acceptsLate reports whether the waiting record w (delivered as r), past
// a gap, has waited GapTimeout and is applied over it
// (sequence.TimeoutAccept). It has waited since it was stored, or since
// its first failure on an earlier hop.
func (s *dbScope) acceptsLate(r *consumer.Record, w *waitingRow) bool {
	first := s.f.Metadata(r).FirstFailure
	if first.IsZero() {
		first = w.since
	}
	return s.o.Versions.AcceptsLate(first)
}

// releaseGap decides where the waiting record w (delivered as r), whose
// version is past a gap that is not accepted, goes: the step of its route
// and the error it fails with.
func (s *dbScope) releaseGap(ctx context.Context, w *waitingRow, r *consumer.Record, check sequence.Result, tries map[string]int, rel *released) (*retrytopic.Step, error) {
	// It has waited for the missing versions since it was stored
	// behind its key's head: GapTimeout counts from then, so
	// records behind a gap that never fills time out together
	// with the head, not one GapTimeout after another.
	gap := &retrytopic.VersionGapError{Expected: check.Expected(), Actual: w.version}
	m := s.f.Metadata(r)
	if m.FirstFailure.IsZero() {
		m.FirstFailure = w.since
	}
	st, note, herr := s.gapRoute(ctx, r, m, gap, tries[w.id]+1)
	rel.first = m.FirstFailure
	rel.gaps = append(rel.gaps, releasedGap{r, note, gap.Error(), 0})
	rel.routedGap = true
	return &st, herr
}

// releaseApplied records the waiting record w (delivered as r) as applied
// in a release transaction, its handler's writes kept: with no error, or
// herr a business skip. With versions, its version becomes its key's last.
func (s *dbScope) releaseApplied(ctx context.Context, tx pgx.Tx, topic string, key []byte, w *waitingRow, r *consumer.Record, herr error, rel *released) (stop bool, err error) {
	if s.o.Versions != nil {
		if _, err := tx.Exec(ctx, s.sqlSaveVersion, s.o.Consumer, topic, key, w.version); err != nil {
			return true, err
		}
	}
	rel.up.add(w.id, statusApplied, 0, 0, "")
	rel.done = append(rel.done, w.seq)
	rel.wrote = true
	if herr != nil {
		rel.skipped++ // a business skip: its writes commit
		rel.ends = append(rel.ends, releasedEnd{rec: r, out: hook.OutcomeSkipped, err: herr})
	} else {
		rel.applied++
		rel.ends = append(rel.ends, releasedEnd{rec: r, out: hook.OutcomeSuccess, err: nil})
	}
	return false, nil
}

// releaseFailed decides, in a release transaction, what becomes of the
// waiting record w (delivered as r) that failed with herr: the step
// gapStep when a version gap decided it, else the failure policy's. It is
// retried in place (stop), skipped, holds its key again (stop; see
// holdReleased), or it becomes the key's head (stop),
// to be routed once the transaction commits.
func (s *dbScope) releaseFailed(ctx context.Context, tx pgx.Tx, topic string, key []byte, w *waitingRow, r *consumer.Record, herr error, gapStep *retrytopic.Step, tries map[string]int, rel *released) (stop bool, err error) {
	var st retrytopic.Step
	if gapStep != nil {
		st = *gapStep
	} else {
		st = s.f.Decide(ctx, r, herr, tries[w.id]+1, true)
	}
	switch st.Action {
	case retrytopic.ActionHold:
		// Its key is held again (consumer.Config.KeyBreaker): it stays
		// first in the waiting table.
		return true, s.holdReleased(ctx, tx, topic, key, w, r, herr, st, rel)
	case retrytopic.ActionRetry:
		rel.wait = st.Delay
		tries[w.id]++
		rel.retry = &releasedEnd{rec: r, err: herr, step: st, attempt: tries[w.id]}
		return true, nil
	case retrytopic.ActionSkip:
		rel.up.add(w.id, statusApplied, 0, 0, "")
		rel.done = append(rel.done, w.seq)
		rel.skipped++
		rel.ends = append(rel.ends, releasedEnd{rec: r, out: hook.OutcomeSkipped, err: herr})
		return false, nil
	}
	// It becomes the key's head: routed once this commits. Where new
	// failures do not park (s.ordered is false), one sent to a retry topic
	// holds the key only while it is routed: its row marks it, with no
	// parked row.
	meta := s.f.Metadata(r)
	total := min(meta.Attempt+tries[w.id]+1, retrytopic.MaxAttempt)
	status := statusRetry
	if st.Action == retrytopic.ActionDeadLetter {
		status = statusDLT
	}
	rel.up.add(w.id, status, total, st.Stage, viaWaiting)
	if st.Action == retrytopic.ActionDeadLetter || s.ordered() {
		if _, err := tx.Exec(ctx, s.sqlPark, s.o.Consumer, topic, key, w.id, meta.OriginalOffset, max(st.Stage, 0), w.version); err != nil {
			return true, err
		}
	}
	if _, err := tx.Exec(ctx, s.sqlWaitingHead, w.seq); err != nil {
		return true, err
	}
	rel.routed, rel.routedErr, rel.step = w, herr, st
	rel.failed++
	return true, nil
}

// routedFromWaiting ends the routing of a waiting record the broker
// acknowledged: its row goes; a dead-lettered one's inbox row says so and
// its key is free again.
func (s *dbScope) routedFromWaiting(ctx context.Context, w *waitingRow, topic string, key []byte, dead bool) error {
	return s.retryTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.sqlDeleteWaiting, []int64{w.seq}); err != nil {
			return err
		}
		if !dead {
			return nil
		}
		if _, err := tx.Exec(ctx, s.sqlSetStatus, s.o.Consumer, []string{w.id}, []string{statusDead}, []int32{0}, []int32{0}, []string{""}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.sqlUnpark, s.o.Consumer, topic, key, w.id)
		return err
	})
}

// applyReleased runs the handler for a record released from the waiting
// table, its writes after a savepoint: a failure rolls back its writes
// alone.
func (s *dbScope) applyReleased(ctx context.Context, tx pgx.Tx, rtx *recordTx, r *consumer.Record) error {
	if s.qh != nil {
		var q Queue
		qerr := s.queue(ctx, &q, r)
		if qerr != nil && s.f.Class(qerr) != consumer.ClassSkip {
			return qerr
		}
		if _, err := tx.Exec(ctx, savepointSQL); err != nil {
			return err
		}
		for _, st := range q.stmts {
			if _, err := tx.Exec(ctx, st.sql, st.args...); err != nil {
				if _, rerr := tx.Exec(ctx, rollbackSQL); rerr != nil {
					return errors.Join(err, rerr)
				}
				return err
			}
		}
		if _, err := tx.Exec(ctx, releaseSQL); err != nil {
			return err
		}
		return qerr
	}
	rtx.reset(ctx)
	herr := s.call(ctx, rtx, r)
	if herr == nil {
		herr = rtx.err
	}
	aborted := tx.Conn().PgConn().TxStatus() == 'E'
	if aborted && herr == nil {
		herr = errAborted
	}
	if (herr != nil && s.f.Class(herr) != consumer.ClassSkip) || aborted {
		if rtx.sp {
			if err := rtx.rollback(ctx); err != nil {
				return errors.Join(herr, err)
			}
		} else if aborted {
			if s.deployment(errors.Join(rtx.err, herr)) {
				// The deployment is wrong, not the record: the release
				// holds (see batchTx.runHandler).
				return firstErr(herr, rtx.err)
			}
			if abortedByStatement(errors.Join(rtx.err, herr)) {
				return &isolateError{err: herr} // see batchTx.runHandler
			}
			return fmt.Errorf("dbscope: the transaction was aborted before the record's savepoint: %w", herr)
		}
	}
	return herr
}
