package dbscope

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
)

// runTx runs one transaction over work. A Handler's writes follow a
// savepoint of their record's (see recordTx), so a failing record is rolled
// back alone and the others' handlers are not called again; at most
// maxSavepoints records take one, the rest are left for the next
// transaction (notTried). A QueueHandler's statements are sent together
// before COMMIT; known holds the records whose statement failed in an
// earlier try, and calls the handlers' results, so that a try runs no
// handler twice. A transient error raised by a record's handler with the
// connection alive ends the transaction early: the records before it
// commit, it and those after it are notTried, and it is returned as stop.
func (s *dbScope) runTx(ctx context.Context, work []*consumer.Record, ids []string, fails map[*consumer.Record]*failure, calls map[*consumer.Record]*queuedCall, known map[int]error, single bool) (res []result, stop *transientError, err error) {
	b := &batchTx{s: s, ctx: ctx, work: work, ids: ids, fails: fails, calls: calls, known: known,
		ordered: s.ordered(), honour: s.honours(), vers: s.o.Versions, cut: len(work), batch: s.bh != nil && !single}
	b.metas = make([]retrytopic.Metadata, len(work))
	for i, r := range work {
		b.metas[i] = s.f.MetadataOf(r, ids[i])
	}
	var fresh freshIDs
	var prior map[string]inboxStatus
	b.tx, fresh, prior, b.park, b.waiting, err = s.begin(ctx, ids, work, b.metas, b.honour)
	defer b.tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	defer func() {
		if err != nil && b.connLost(err) {
			// The connection is gone with the transaction: the queued
			// handlers' statements are not trusted to be what killed it.
			clear(calls)
		}
	}()
	if err != nil {
		return nil, nil, err
	}
	b.classify(fresh, prior)
	// The scope sends up to three statements of its own; a queued
	// handler's record usually queues one.
	room := 3
	if s.qh != nil {
		room += len(work)
	}
	b.q = newPipeline(room)
	b.rtx = &recordTx{tx: b.tx}
	if b.vers != nil {
		b.versions = make([]int64, len(work))
	}
	for i := range work {
		if s.qh == nil && b.savepoints >= maxSavepoints {
			b.cut = i
			break
		}
		if err := b.record(i); err != nil {
			return nil, nil, err
		}
		if b.stop != nil {
			break
		}
	}
	if err := b.runBatch(); err != nil {
		return nil, nil, err
	}
	if err := b.commit(); err != nil {
		return nil, nil, err
	}
	if b.storedWaiting {
		s.parkRows.storedRows()
	}
	return b.res, b.stop, nil
}

// batchTx is one transaction over a batch of records: the state it read at
// its start (inbox rows, parked heads, waiting keys) and what it decides
// for each record. It lives for one runTx call.
type batchTx struct {
	s   *dbScope
	ctx context.Context
	tx  pgx.Tx
	// committing: COMMIT was sent. The pool has the connection back then,
	// whatever COMMIT answered, and may have handed it to another worker:
	// it is not to be touched (see connLost).
	committing bool
	work       []*consumer.Record
	ids        []string
	metas      []retrytopic.Metadata
	fails      map[*consumer.Record]*failure
	calls      map[*consumer.Record]*queuedCall
	known      map[int]error
	ordered    bool // a new failure makes its record its key's head
	// honour: the transaction reads its keys' parked heads and waiting
	// records and honours them (s.honours): set when ordered, and in a
	// pipeline that is not while rows an ordered one left may remain.
	honour bool
	vers   *sequence.Config

	park          parking
	waiting       map[pairKey]bool
	storedWaiting bool // a record of it waits in PostgreSQL

	res []result
	// isNew[i]: record i's inbox row is new in this transaction; it is
	// deleted again if the record ends without an outcome (retried in
	// place, deferred, not tried), so that its next delivery runs it.
	isNew []bool
	up    statusUpdates
	undo  []string
	// q holds the statements sent, pipelined, before COMMIT: the queued
	// handlers' and the scope's own closing ones.
	q          *pipeline
	rtx        *recordTx
	savepoints int
	cut        int // the records from cut on are notTried
	// versions[i] is record i's version when versions are checked.
	versions []int64
	// batch: a BatchHandler's records go to one call (ready) instead of
	// a call each (see runBatch); unset when the transaction runs one
	// record at a time.
	batch       bool
	ready       []int
	blocked     map[string]bool // keys with a failed record in this transaction
	blockedNull bool
	stop        *transientError
}

// classify decides, from the inbox rows read at the start, which records
// run and which are duplicates or copies being routed again.
func (b *batchTx) classify(fresh freshIDs, prior map[string]inboxStatus) {
	b.res = make([]result, len(b.work))
	b.isNew = make([]bool, len(b.work))
	if fresh.all {
		// Every id got a new row, so no two are the same: each record runs.
		for i := range b.work {
			b.res[i].out, b.isNew[i] = toApply, true
		}
		return
	}
	seen := make(map[string]bool, len(b.ids))
	for i, id := range b.ids {
		r := b.work[i]
		st, had := prior[id]
		m := b.metas[i]
		switch {
		case seen[id]:
			// A second copy in the batch of an identity whose earlier copy
			// runs (or is routed again): that one's outcome is its own.
			b.res[i].out = duplicate
		case fresh.has(id):
			b.res[i].out, b.isNew[i] = toApply, true
		case had && st.status == statusRetry && m.Stage >= 0 && !m.Parked && m.Attempt == st.attempt:
			b.res[i].out = toApply // the hop it was sent on: it runs again
		case had && st.status == statusResolved:
			b.res[i].out = duplicate // skipped by an operator: never applied
		case had && st.status == statusDead && hasHeader(r, retrytopic.HeaderRedrive):
			b.res[i].out = toApply // redriven from the DLT by an operator
		case had && (st.status == statusRetry || st.status == statusDLT) && st.via == coords(r):
			// The copy that was being routed when the process stopped:
			// its routing may not have reached the broker.
			b.res[i] = result{out: rerouteOutcome, st: st}
		default:
			b.res[i].out = duplicate
		}
		// An earlier copy that is a no-op (a stale hop, a crash re-send)
		// says nothing of a later one: the live hop behind it in the same
		// batch still runs.
		if b.res[i].out == toApply || b.res[i].out == rerouteOutcome {
			seen[id] = true
		}
	}
}

// record decides record i: it waits, is stale, fails before its handler,
// or runs its handler and succeeds or fails. It sets b.stop when a
// transient error ends the transaction at i.
func (b *batchTx) record(i int) error {
	r := b.work[i]
	if b.res[i].out == duplicate || b.res[i].out == rerouteOutcome {
		return nil
	}
	if (r.Key == nil && b.blockedNull) || (r.Key != nil && b.blocked[string(r.Key)]) {
		b.res[i].out = deferred
		b.forget(i)
		return nil
	}
	if b.vers != nil && r.Key != nil {
		v, err := b.vers.Version(r)
		if err != nil {
			herr := consumer.DecodeError(err) // poison: the DLT, with the reason
			return b.fail(i, herr, b.s.f.Decide(b.ctx, r, herr, b.attemptOf(r), false))
		}
		b.versions[i] = v
	}
	if waits, err := b.waitBehindHead(i); waits || err != nil {
		return err
	}
	hctx := b.s.obs.Context(b.ctx, r)
	if b.batch && b.vers != nil && r.Key != nil && b.readyHas(i) {
		if err := b.runBatch(); err != nil {
			return err
		}
	}
	if b.vers != nil && r.Key != nil {
		check, done, err := b.checkVersion(i)
		if done || err != nil {
			return err
		}
		hctx = sequence.WithResult(hctx, check)
	}
	var herr error
	var handled bool
	var err error
	switch {
	case b.batch:
		return b.toBatch(i)
	case b.s.qh != nil:
		herr, handled, err = b.runQueued(i, hctx)
	default:
		herr, handled, err = b.runHandler(i, hctx)
	}
	if handled || err != nil || b.stop != nil {
		return err
	}
	return b.failed(i, herr)
}

// waitBehindHead stores record i in PostgreSQL, behind its key's head, when
// its key has a record in the retry topics (the head) or records waiting,
// unless it is the head or a version that fills the gap the head waits
// for. It reports whether the record waits.
func (b *batchTx) waitBehindHead(i int) (bool, error) {
	r := b.work[i]
	if !b.honour || r.Key == nil || (len(b.park) == 0 && len(b.waiting) == 0) {
		return false, nil // no key of the batch has a head or records waiting
	}
	k := pairKey{b.metas[i].OriginalTopic, string(r.Key)}
	h, ok := b.park.head(k)
	fills := b.versions != nil && h.version > 0 && b.versions[i] < h.version
	if waits := (ok && h.id != b.ids[i] && !fills) || (!ok && b.waiting[k]); !waits {
		return false, nil
	}
	b.q.Exec(b.s.sqlWait, b.s.waitArgs(k.topic, r, b.ids[i], b.version(i))...)
	if b.park.has(k, b.ids[i]) {
		// In the retry topics behind a head (parked before the waiting
		// table): it waits in PostgreSQL now.
		b.park.remove(k, b.ids[i])
		if _, err := b.tx.Exec(b.ctx, b.s.sqlUnpark, b.s.o.Consumer, k.topic, r.Key, b.ids[i]); err != nil {
			return true, err
		}
	}
	b.waiting[k] = true
	b.storedWaiting = true
	b.setStatus(i, statusParked, 0, 0)
	b.res[i] = result{out: parkedOutcome}
	return true, nil
}

// checkVersion checks record i's version against its key's last applied
// one. done reports that the record's outcome is decided (stale, or a gap
// that waits or goes to the DLT); otherwise check goes to the handler.
func (b *batchTx) checkVersion(i int) (check sequence.Result, done bool, err error) {
	r, m := b.work[i], b.metas[i]
	check, err = b.s.checkVersion(b.ctx, b.tx, m.OriginalTopic, r.Key, b.versions[i])
	if err != nil {
		return check, true, err
	}
	switch {
	case check.Outcome == sequence.Stale:
		b.res[i].out = staleOutcome
		b.setStatus(i, statusApplied, 0, 0)
		return check, true, b.unpark(i)
	case check.Outcome == sequence.Gap && b.s.o.FillGap != nil:
		b.res[i].gap = gapFilled // its handler's call fills it first (scope.call)
	case check.Outcome == sequence.Gap && b.vers.Gaps != sequence.Accept && !b.vers.AcceptsLate(m.FirstFailure):
		return check, true, b.gap(i, check)
	case check.Outcome == sequence.Gap:
		b.res[i].gap = gapAccepted
		b.res[i].skipped = check.Version - check.Expected()
	case m.ExpectedVersion > 0:
		b.res[i].gap = gapHealed
	}
	return check, false, nil
}

// gap routes record i, found ahead of its key's next version, as
// scope.gapRoute decides: to the DLT, or to the next retry topic with its
// key parked behind it (the missing versions still pass).
func (b *batchTx) gap(i int, check sequence.Result) error {
	r, m := b.work[i], b.metas[i]
	gap := &retrytopic.VersionGapError{Expected: check.Expected(), Actual: b.versions[i]}
	step, note, herr := b.s.gapRoute(b.ctx, r, m, gap, b.attemptOf(r))
	if err := b.fail(i, herr, step); err != nil {
		return err
	}
	b.res[i].gap, b.res[i].gapDetail = note, gap.Error()
	if step.Action == retrytopic.ActionRetryTopic && b.ordered && r.Key != nil {
		return b.setPark(i, step.Stage)
	}
	return nil // to the DLT: its head row goes once the DLT has it
}

// runQueued runs record i's QueueHandler once per delivery (its result is
// kept in calls across tries) and, on success or a business skip, queues
// what it queued. handled reports that the record succeeded.
func (b *batchTx) runQueued(i int, hctx context.Context) (herr error, handled bool, err error) {
	r := b.work[i]
	c := b.calls[r]
	switch {
	case b.known[i] != nil:
		herr = b.known[i] // a statement of its failed in an earlier try
	case c == nil:
		c = &queuedCall{}
		c.err = b.s.queue(hctx, &c.q, r)
		b.calls[r] = c
		herr = c.err
	default:
		herr = c.err
	}
	if herr != nil && b.known[i] == nil && (b.s.transient(herr) || b.s.deployment(herr)) {
		b.cut, b.stop = i, &transientError{rec: r, err: herr}
		return herr, false, nil
	}
	if herr == nil || (b.known[i] == nil && b.s.f.Class(herr) == consumer.ClassSkip) {
		// Success, or a business skip: what it queued is sent.
		b.q.add(i, &c.q)
		return herr, true, b.succeed(i, herr)
	}
	return herr, false, nil
}

// runHandler runs record i's Handler after its savepoint (taken lazily by
// recordTx) and rolls a failure back to it. handled reports that the
// record succeeded, or was skipped.
func (b *batchTx) runHandler(i int, hctx context.Context) (herr error, handled bool, err error) {
	r := b.work[i]
	if herr = b.known[i]; herr != nil {
		// Its first statement aborted an earlier try of this transaction,
		// or its writes broke a deferred constraint at COMMIT: it fails
		// with that error, without its handler being called again (a
		// business skip stays one, without its writes).
		if b.s.f.Class(herr) == consumer.ClassSkip {
			b.res[i].err = fmt.Errorf("%w; %s", herr, lostWrites)
			return herr, true, b.succeed(i, herr)
		}
		return herr, false, nil
	}
	b.rtx.reset(hctx)
	herr = b.s.call(hctx, b.rtx, r)
	if b.rtx.sp {
		b.savepoints++
	}
	conn := b.tx.Conn()
	if conn.IsClosed() {
		if herr == nil {
			herr = errConnLost
		}
		return herr, false, &transientError{rec: r, err: herr}
	}
	if herr == nil {
		herr = b.rtx.err // it could not write: it did not apply
	}
	aborted := conn.PgConn().TxStatus() == 'E'
	ok := !aborted && (herr == nil || b.s.f.Class(herr) == consumer.ClassSkip)
	if !ok && b.rtx.sp {
		if err := b.rtx.rollback(b.ctx); err != nil {
			return herr, false, err
		}
	} else if aborted {
		// The transaction was aborted before the record's savepoint ran:
		// recordTx.Exec sends a first statement with its SAVEPOINT in one
		// round trip, but pgx prepares a statement new to the connection
		// before running anything of that batch, so a statement
		// PostgreSQL cannot prepare (a missing table or column, a syntax
		// or type error) fails before SAVEPOINT. Nothing of the
		// transaction can be kept. When PostgreSQL refused the statement
		// (a *pgconn.PgError that is not transient), the record is at
		// fault: the transaction runs again with the record failing with
		// herr and its handler not called, as for a queued statement
		// (the records before it are called again). Taking the savepoint
		// first instead would cost a round trip for every record whose
		// first statement may be new to the connection, and pgx does not
		// say which are. A lost connection or a transient error retries
		// the transaction; so does an error that says the deployment is
		// wrong (a missing table): the records before it commit first,
		// and the key-shard holds.
		if b.s.deployment(errors.Join(b.rtx.err, herr)) {
			return herr, false, &transientError{rec: r, err: firstErr(herr, b.rtx.err)}
		}
		if abortedByStatement(errors.Join(b.rtx.err, herr)) {
			return herr, false, &isolateError{i: i, err: herr}
		}
		return herr, false, fmt.Errorf("dbscope: the transaction was aborted before the record's savepoint: %w", errors.Join(herr, b.rtx.err))
	}
	if herr != nil && (b.s.transient(herr) || b.s.deployment(herr)) {
		b.cut, b.stop = i, &transientError{rec: r, err: herr}
		return herr, false, nil
	}
	switch {
	case aborted && herr == nil:
		herr = errAborted
	case aborted && b.s.f.Class(herr) == consumer.ClassSkip:
		// A business skip stays one, without its writes.
		b.res[i].err = fmt.Errorf("%w; %s", herr, lostWrites)
		ok = true
	}
	if ok {
		return herr, true, b.succeed(i, herr)
	}
	return herr, false, nil
}

// failed routes record i after its handler failed with herr, by the
// failure policy: null-key records keep their partition order by retrying
// in place, unless the pipeline is unordered.
func (b *batchTx) failed(i int, herr error) error {
	r := b.work[i]
	attempt := b.attemptOf(r)
	pol := b.s.f.Policy()
	topics := !pol.DisableRetryTopics && (r.Key != nil || pol.Unordered)
	step := b.s.f.Decide(b.ctx, r, herr, attempt, topics)
	if step.Action == retrytopic.ActionHold {
		return b.hold(i, herr, step) // its key's circuit breaker holds it (keyhold.go)
	}
	b.res[i] = result{out: failedOutcome, err: herr, step: step}
	b.routed(i, step, attempt)
	b.block(r)
	switch {
	case step.Action == retrytopic.ActionRetryTopic && r.Key != nil && (b.ordered || b.isHead(i)):
		// It is, or stays, its key's head. (Where new failures do not
		// park, a head an ordered deployment left stays the head until
		// it resolves: the records waiting behind it keep their order.)
		return b.setPark(i, step.Stage)
	case step.Action == retrytopic.ActionSkip:
		return b.unpark(i)
	}
	return nil
}

// commit leaves the untried records for the next transaction, sends the
// closing statements (inbox rows forgotten or updated, the stored
// position) with the queued ones, and commits.
func (b *batchTx) commit() error {
	s := b.s
	for j := b.cut; j < len(b.work); j++ {
		if b.res[j].out == toApply && b.isNew[j] {
			b.undo = append(b.undo, b.ids[j]) // its inbox row goes until it is tried
		}
		b.res[j] = result{out: notTried}
	}
	if len(b.undo) > 0 {
		b.q.Exec(s.sqlForget, s.o.Consumer, b.undo)
	}
	if up := b.up; len(up.ids) > 0 {
		b.q.Exec(s.sqlSetStatus, s.o.Consumer, up.ids, up.statuses, up.attempts, up.stages, up.vias)
	}
	if s.o.StoreOffsets {
		k := 0
		for k < len(b.work) && b.res[k].out.durable() {
			k++
		}
		if k > 0 {
			r := b.work[k-1]
			b.q.Exec(s.sqlOffset, s.o.Consumer, r.Topic, r.Partition, s.eng.Shard(r), s.shards, r.Offset+1, s.routing)
		}
	}
	if err := b.q.send(b.ctx, b.tx); err != nil {
		var se *stmtError
		if sql, ok := encodingFailure(err); ok && errors.As(err, &se) {
			// pgx could not encode a queued statement's arguments, and
			// closed the connection: the record whose arguments fail is
			// at fault, not the transaction.
			if i := b.q.encodingCulprit(b.ctx, s.o.Pool, sql); i >= 0 {
				return &isolateError{i: i, err: se.err}
			}
		}
		if errors.As(err, &se) && se.owner >= 0 {
			if IsTransient(se.err) || b.s.deployment(se.err) || b.tx.Conn().IsClosed() {
				return &transientError{rec: b.work[se.owner], err: se.err}
			}
			// A queued statement of record se.owner failed: the batch
			// runs again without that record's statements.
			return &isolateError{i: se.owner, err: se.err}
		}
		return unwrapStmt(err)
	}
	b.committing = true
	err := b.tx.Commit(b.ctx)
	if deferredRefusal(err) {
		// A deferred check that a record's writes broke, refusing the
		// COMMIT. Which record is found by running fewer
		// of them (see scope.apply).
		v := &commitViolation{err: err}
		for j := range b.cut {
			if o := b.res[j].out; (o == applied || o == skipped) && b.known[j] == nil {
				v.wrote = append(v.wrote, j)
			}
		}
		return v
	}
	return err
}

// connLost reports whether the transaction, which failed with err, lost
// its connection. Once COMMIT was sent, the connection belongs to the pool
// again, so this is judged from err: any failure other than the server's
// answer (a *pgconn.PgError) is taken for a lost connection.
func (b *batchTx) connLost(err error) bool {
	if b.tx == nil {
		return true
	}
	if b.committing {
		var pg *pgconn.PgError
		return !errors.As(err, &pg)
	}
	return b.tx.Conn() == nil || b.tx.Conn().IsClosed()
}

// firstErr returns the first of errs that is not nil.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
