package dbscope

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/engine"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
)

// Inbox statuses: what the inbox remembers of an identity's outcome.
const (
	statusApplied = "applied" // applied, skipped or stale
	statusParked  = "parked"  // waiting in PostgreSQL behind its key's head
	statusRetry   = "retry"   // in the retry topics: only the hop of its attempt count runs it
	statusDLT     = "dlt"     // going to the dead-letter topic
	statusDead    = "dead"    // the dead-letter topic acknowledged it
)

// viaWaiting is the via of an outcome decided for a record released from
// the waiting table: no consumed copy of it routes it again.
const viaWaiting = "waiting"

// releaseInterval is how often the scope looks for keys whose waiting
// records no head holds back any more (a process that stopped between two
// chunks of a release leaves such keys).
const releaseInterval = 2 * time.Second

// inboxStatus is an existing inbox row's outcome.
type inboxStatus struct {
	status  string
	attempt int
	stage   int
	via     string
}

// coords names a consumed copy of a record.
func coords(r *consumer.Record) string {
	return r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10)
}

// statusUpdates collects the inbox outcomes a transaction writes.
type statusUpdates struct {
	ids, statuses, vias []string
	attempts, stages    []int32
}

func (u *statusUpdates) add(id, status string, attempt, stage int, via string) {
	u.ids = append(u.ids, id)
	u.statuses = append(u.statuses, status)
	u.attempts = append(u.attempts, int32(attempt))
	u.stages = append(u.stages, int32(max(stage, 0)))
	u.vias = append(u.vias, via)
}

// hasHeader reports whether r carries a header named key.
func hasHeader(r *consumer.Record, key string) bool {
	_, ok := r.Header(key)
	return ok
}

// headerArrays splits headers into the waiting table's two arrays.
func headerArrays(hs []kgo.RecordHeader) ([]string, [][]byte) {
	keys := make([]string, len(hs))
	vals := make([][]byte, len(hs))
	for i, h := range hs {
		keys[i] = h.Key
		vals[i] = h.Value
		if vals[i] == nil {
			vals[i] = []byte{}
		}
	}
	return keys, vals
}

// waitArgs are the arguments of sqlWait for record r of identity id.
func (s *scope) waitArgs(topic string, r *consumer.Record, id string, version int64) []any {
	keys, vals := headerArrays(r.Headers)
	ts := r.Timestamp
	if ts.IsZero() {
		ts = time.Now()
	}
	return []any{s.o.Consumer, topic, r.Key, id, r.Topic, r.Partition, r.Offset, ts, r.Value, keys, vals, version}
}

// waitingRow is a stored record read back from the waiting table.
type waitingRow struct {
	seq     int64
	id      string
	version int64
	head    bool
	rec     *consumer.Record
}

// scanWaiting reads rows of sqlLoadWaitingRows.
func scanWaiting(rows pgx.Rows) ([]waitingRow, error) {
	defer rows.Close()
	var out []waitingRow
	for rows.Next() {
		var w waitingRow
		kr := &kgo.Record{}
		var keys []string
		var vals [][]byte
		if err := rows.Scan(&w.seq, &w.id, &kr.Key, &kr.Topic, &kr.Partition, &kr.Offset, &kr.Timestamp, &kr.Value, &keys, &vals, &w.version, &w.head); err != nil {
			return nil, err
		}
		for i := range keys {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: keys[i], Value: vals[i]})
		}
		w.rec = &consumer.Record{Record: kr}
		out = append(out, w)
	}
	return out, rows.Err()
}

// errRoutedAgain is the error a routed record carries when it is routed
// again after a restart that may have lost the first routing.
var errRoutedAgain = errors.New("kscope: routed again after a restart; the earlier routing of this record may not have reached the broker")

// reroute routes again the record r whose inbox outcome st says it was
// being routed by this very copy when the process stopped: the same hop of
// the retry topics, or the dead-letter topic.
func (s *scope) reroute(ctx context.Context, r *consumer.Record, st inboxStatus) error {
	if err := s.rerouteOnly(ctx, r, st); err != nil {
		return err
	}
	if st.status == statusDLT {
		return s.markDead(ctx, s.identity.Of(r), s.f.Metadata(r).OriginalTopic, r.Key)
	}
	return nil
}

// markDead records that the dead-letter topic acknowledged the record of
// identity id: its inbox row says so, and its key (if it held one back) is
// released.
func (s *scope) markDead(ctx context.Context, id, topic string, key []byte) error {
	return s.retryTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.sqlSetStatus, s.o.Consumer, []string{id}, []string{statusDead}, []int32{0}, []int32{0}, []string{""}); err != nil {
			return err
		}
		if key == nil {
			return nil
		}
		_, err := tx.Exec(ctx, s.sqlUnpark, s.o.Consumer, topic, key, id)
		return err
	})
}

// retryTx runs fn in a transaction until it commits, on the runner's
// retry loop (engine.Failures.Rounds): a failed transaction is retried
// after a growing backoff; only a done ctx stops it.
func (s *scope) retryTx(ctx context.Context, fn func(pgx.Tx) error) error {
	if s.f.Rounds(ctx, nil, func() engine.Round {
		if err := pgx.BeginFunc(ctx, s.o.Pool, fn); err != nil {
			if ctx.Err() != nil {
				return engine.Round{Stop: true}
			}
			s.txRetries.Add(1)
			return engine.Round{More: true, Err: err}
		}
		s.transactions.Add(1)
		return engine.Round{}
	}) {
		return nil
	}
	return ctx.Err()
}

// release applies the waiting records of key (of original topic topic)
// from PostgreSQL, in arrival order, in transactions of at most
// maxSavepoints records, until none is left or one of them fails and
// becomes the key's new head (it goes to the retry topics or the DLT; the
// rest stay behind it). It does nothing while the key has a head.
func (s *scope) release(ctx context.Context, topic string, key []byte) error {
	tries := map[string]int{}   // in-place attempts per identity
	known := map[string]error{} // failures that aborted an earlier try, per identity
	var err error
	ok := s.f.Rounds(ctx, nil, func() engine.Round {
		var rel released
		if err = s.retryTx(ctx, func(tx pgx.Tx) error {
			var err error
			rel, err = s.releaseTx(ctx, tx, topic, key, tries, known)
			return err
		}); err != nil {
			return engine.Round{Stop: true}
		}
		if rel.routed != nil {
			attempt := tries[rel.routed.id] + 1
			if err = s.f.Route(ctx, rel.routed.rec, rel.routedErr, rel.step, attempt, time.Now()); err != nil {
				return engine.Round{Stop: true}
			}
			if err = s.routedFromWaiting(ctx, rel.routed, topic, key, rel.step.Action == retrytopic.ActionDeadLetter); err != nil {
				return engine.Round{Stop: true}
			}
			// Past a dead letter, the next waiting record is the key's
			// head; one in the retry topics holds the key.
			return engine.Round{More: rel.step.Action == retrytopic.ActionDeadLetter}
		}
		// A retry in place waits its delay; a full transaction may have
		// left more waiting records.
		return engine.Round{More: rel.wait > 0 || rel.n >= maxSavepoints, Wait: rel.wait}
	})
	if !ok && err == nil {
		err = ctx.Err()
	}
	return err
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
}

// releaseTx is one release transaction: under the key's lock, unless the
// key has a head, it applies the key's waiting records in order until one
// fails (it retries in place after rel.wait, or becomes the head). A
// record whose failure aborted the transaction before its savepoint is
// put in known, and the transaction fails: in the next one, that record
// fails with that error without its handler being called.
func (s *scope) releaseTx(ctx context.Context, tx pgx.Tx, topic string, key []byte, tries map[string]int, known map[string]error) (rel released, err error) {
	if _, err := tx.Exec(ctx, s.sqlLockKeys, s.o.Consumer, []string{topic}, [][]byte{key}); err != nil {
		return rel, err
	}
	var heads int
	if err := tx.QueryRow(ctx, s.sqlCountHeads, s.o.Consumer, topic, key).Scan(&heads); err != nil || heads > 0 {
		return rel, err
	}
	rows, err := tx.Query(ctx, s.sqlLoadWaitingRows, s.o.Consumer, topic, key, maxSavepoints)
	if err != nil {
		return rel, err
	}
	ws, err := scanWaiting(rows)
	if err != nil {
		return rel, err
	}
	rel.n = len(ws)
	rtx := &recordTx{tx: tx}
	for i := range ws {
		if ws[i].head {
			return released{n: rel.n}, nil // being routed by another release: it holds the key
		}
		stop, err := s.releaseOne(ctx, tx, rtx, topic, key, &ws[i], tries, known, &rel)
		if err != nil {
			return rel, err
		}
		if stop {
			break
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
func (s *scope) releaseOne(ctx context.Context, tx pgx.Tx, rtx *recordTx, topic string, key []byte, w *waitingRow, tries map[string]int, known map[string]error, rel *released) (stop bool, err error) {
	r := w.rec
	hctx := ctx
	herr := error(nil)
	if s.o.Versions != nil {
		check, err := s.checkVersion(ctx, tx, topic, key, w.version)
		if err != nil {
			return true, err
		}
		switch {
		case check.Outcome == sequence.Stale:
			rel.up.add(w.id, statusApplied, 0, 0, "")
			rel.done = append(rel.done, w.seq)
			s.stale.Add(1)
			return false, nil
		case check.Outcome == sequence.Gap && s.o.Versions.Gaps != sequence.Accept:
			gap := &retrytopic.VersionGapError{Expected: check.Expected(), Actual: w.version}
			herr = consumer.Retryable(gap)
			if s.o.Versions.Gaps == sequence.DeadLetter {
				herr = consumer.Terminal(gap)
			}
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
	if herr != nil && s.transient(herr) {
		return true, herr
	}
	if herr == nil || s.f.Class(herr) == consumer.ClassSkip {
		if s.o.Versions != nil {
			if _, err := tx.Exec(ctx, s.sqlSaveVersion, s.o.Consumer, topic, key, w.version); err != nil {
				return true, err
			}
		}
		rel.up.add(w.id, statusApplied, 0, 0, "")
		rel.done = append(rel.done, w.seq)
		s.applied.Add(1)
		return false, nil
	}
	st := s.f.Decide(ctx, r, herr, tries[w.id]+1, true)
	switch st.Action {
	case retrytopic.ActionRetry:
		rel.wait = st.Delay
		tries[w.id]++
		return true, nil
	case retrytopic.ActionSkip:
		rel.up.add(w.id, statusApplied, 0, 0, "")
		rel.done = append(rel.done, w.seq)
		return false, nil
	}
	// It becomes the key's head: routed once this commits.
	meta := s.f.Metadata(r)
	total := min(meta.Attempt+tries[w.id]+1, retrytopic.MaxAttempt)
	status := statusRetry
	if st.Action == retrytopic.ActionDeadLetter {
		status = statusDLT
	}
	rel.up.add(w.id, status, total, st.Stage, viaWaiting)
	if _, err := tx.Exec(ctx, s.sqlPark, s.o.Consumer, topic, key, w.id, meta.OriginalOffset, max(st.Stage, 0), w.version); err != nil {
		return true, err
	}
	if _, err := tx.Exec(ctx, s.sqlWaitingHead, w.seq); err != nil {
		return true, err
	}
	rel.routed, rel.routedErr, rel.step = w, herr, st
	s.failed.Add(1)
	return true, nil
}

// routedFromWaiting ends the routing of a waiting record the broker
// acknowledged: its row goes; a dead-lettered one's inbox row says so and
// its key is free again.
func (s *scope) routedFromWaiting(ctx context.Context, w *waitingRow, topic string, key []byte, dead bool) error {
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
func (s *scope) applyReleased(ctx context.Context, tx pgx.Tx, rtx *recordTx, r *consumer.Record) error {
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
			if abortedByStatement(errors.Join(rtx.err, herr)) {
				return &isolateError{err: herr} // see batchTx.runHandler
			}
			return fmt.Errorf("dbscope: the transaction was aborted before the record's savepoint: %w", herr)
		}
	}
	return herr
}

// recoverParking finishes what a stopped process left: waiting records
// that were being routed as their key's head are routed again (once, at
// start), and keys whose waiting records no head holds back are released.
func (s *scope) recoverParking(ctx context.Context, start bool) {
	if start {
		rows, err := s.o.Pool.Query(ctx, s.sqlLoadWaitingHeads, s.o.Consumer)
		if err != nil {
			s.logRecover(ctx, err)
			return
		}
		ws, err := scanWaitingKeyed(rows)
		if err != nil {
			s.logRecover(ctx, err)
			return
		}
		for _, w := range ws {
			var st inboxStatus
			err := s.o.Pool.QueryRow(ctx, s.sqlOneStatus, s.o.Consumer, w.id).Scan(&st.status, &st.attempt, &st.stage, &st.via)
			if err != nil {
				s.logRecover(ctx, err)
				return
			}
			if st.status == statusRetry || st.status == statusDLT {
				if err := s.rerouteOnly(ctx, w.rec, st); err != nil {
					s.logRecover(ctx, err)
					return
				}
			}
			if err := s.routedFromWaiting(ctx, &w.waitingRow, w.topic, w.rec.Key, st.status == statusDLT); err != nil {
				s.logRecover(ctx, err)
				return
			}
		}
	}
	rows, err := s.o.Pool.Query(ctx, s.sqlOrphanKeys, s.o.Consumer)
	if err != nil {
		s.logRecover(ctx, err)
		return
	}
	type tk struct {
		topic string
		key   []byte
	}
	var keys []tk
	for rows.Next() {
		var k tk
		if err := rows.Scan(&k.topic, &k.key); err != nil {
			rows.Close()
			s.logRecover(ctx, err)
			return
		}
		keys = append(keys, k)
	}
	rows.Close()
	for _, k := range keys {
		if err := s.release(ctx, k.topic, k.key); err != nil {
			s.logRecover(ctx, err)
			return
		}
	}
}

// rerouteOnly routes r again as its inbox outcome st says, without
// recording anything.
func (s *scope) rerouteOnly(ctx context.Context, r *consumer.Record, st inboxStatus) error {
	meta := s.f.Metadata(r)
	attempt := max(1, st.attempt-meta.Attempt)
	pol := s.f.Policy()
	step := retrytopic.Step{Action: retrytopic.ActionDeadLetter, Class: consumer.ClassTerminal}
	if st.status == statusRetry && len(pol.Ladder) > 0 {
		stage := max(0, min(st.stage, len(pol.Ladder)-1))
		step = retrytopic.Step{Action: retrytopic.ActionRetryTopic, Class: consumer.ClassRetryable, Stage: stage,
			Delay: pol.Ladder[stage], Topic: retrytopic.RetryTopic(s.group, pol.Ladder[stage])}
	}
	return s.f.Route(ctx, r, errRoutedAgain, step, attempt, time.Now())
}

func (s *scope) logRecover(ctx context.Context, err error) {
	if ctx.Err() == nil {
		s.log.Warn("kscope: releasing parked records failed; retrying later", "err", err)
	}
}

// keyedWaiting is a waiting row with its original topic.
type keyedWaiting struct {
	waitingRow
	topic string
}

// scanWaitingKeyed reads rows of sqlLoadWaitingHeads: a topic, then the
// columns of sqlLoadWaitingRows.
func scanWaitingKeyed(rows pgx.Rows) ([]keyedWaiting, error) {
	defer rows.Close()
	var out []keyedWaiting
	for rows.Next() {
		var w keyedWaiting
		kr := &kgo.Record{}
		var keys []string
		var vals [][]byte
		if err := rows.Scan(&w.topic, &w.seq, &w.id, &kr.Key, &kr.Topic, &kr.Partition, &kr.Offset, &kr.Timestamp, &kr.Value, &keys, &vals, &w.version, &w.head); err != nil {
			return nil, err
		}
		for i := range keys {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: keys[i], Value: vals[i]})
		}
		w.rec = &consumer.Record{Record: kr}
		out = append(out, w)
	}
	return out, rows.Err()
}
