package dbscope

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/retrytopic"
)

// recovery is what the recovery of parked records (recoverParking) keeps
// from one pass to the next.
type recovery struct {
	done  bool           // a pass completed
	heads map[int64]bool // the head rows the last pass found and left
}

// recoverParking finishes what a stopped process, or a release whose
// context ended, left: a waiting record that was being routed as its key's
// head is routed again (see recoverHead), and keys whose waiting records
// no head holds back are released. RunBackground runs it at start and
// every releaseInterval. Until a pass completes, a pass routes every head
// row again at once (what a stopped process left); after that, only a
// head row found by the pass before too, so that a release of another
// process has that long to finish its own routing. A head row this
// process is routing is left alone. Then the keys held by their circuit
// breaker whose probe is due are probed (probeHeld). In a pipeline that
// parks no new failure, a pass first looks whether the consumer has
// parked or waiting rows at all, and keeps s.parkRows up to date.
func (s *dbScope) recoverParking(ctx context.Context, rec *recovery) {
	if err := s.recoverPass(ctx, rec); err != nil {
		s.logRecover(ctx, err)
		return
	}
	rec.done = true
}

// recoverPass is one pass of recoverParking.
func (s *dbScope) recoverPass(ctx context.Context, rec *recovery) error {
	if !s.ordered() {
		found, err := s.parkRows.scan(func() (found bool, err error) {
			err = s.o.Pool.QueryRow(ctx, s.sqlHasParking, s.o.Consumer).Scan(&found)
			return found, err
		})
		if err != nil || !found {
			rec.heads = nil
			if err == nil {
				s.heldKeys.Store(0)
			}
			return err
		}
	}
	rows, err := s.o.Pool.Query(ctx, s.sqlLoadWaitingHeads, s.o.Consumer)
	if err != nil {
		return err
	}
	ws, err := scanWaitingKeyed(rows)
	if err != nil {
		return err
	}
	left := map[int64]bool{}
	for _, w := range ws {
		if s.inRoute.has(w.seq) || (rec.done && !rec.heads[w.seq]) {
			left[w.seq] = true
			continue
		}
		if err := s.recoverHead(ctx, w); err != nil {
			return err
		}
	}
	rec.heads = left
	rows, err = s.o.Pool.Query(ctx, s.sqlOrphanKeys, s.o.Consumer)
	if err != nil {
		return err
	}
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (heldKey, error) {
		var k heldKey
		err := row.Scan(&k.topic, &k.key)
		return k, err
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := s.release(ctx, k.topic, k.key); err != nil {
			return err
		}
	}
	return s.probeHeld(ctx)
}

// recoverHead finishes the routing of w, a waiting record marked as its
// key's head, whose release was cut short. Under the key's lock it reads
// w's inbox outcome again: a record still to be routed from the waiting
// table is routed again, and its row goes once the broker has it; one
// whose routing already reached the broker (applied, dead-lettered, or
// routed on by a later hop since) only has its row deleted. A release of
// this process that routes w meanwhile is left to finish.
func (s *dbScope) recoverHead(ctx context.Context, w keyedWaiting) error {
	var st inboxStatus
	var again bool
	if err := s.retryTx(ctx, func(tx pgx.Tx) error {
		again = false
		if _, err := tx.Exec(ctx, s.sqlLockKeys, s.o.Consumer, []string{w.topic}, [][]byte{w.rec.Key}); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, s.sqlWaitingHeadExists, w.seq).Scan(&exists); err != nil || !exists || s.inRoute.has(w.seq) {
			return err
		}
		err := tx.QueryRow(ctx, s.sqlOneStatus, s.o.Consumer, w.id).Scan(&st.status, &st.attempt, &st.stage, &st.via)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			st = inboxStatus{status: statusApplied} // the inbox forgets only applied and dead-lettered records
		case err != nil:
			return err
		}
		if (st.status == statusRetry || st.status == statusDLT) && st.via == viaWaiting {
			again = true
			return nil
		}
		_, err = tx.Exec(ctx, s.sqlDeleteWaiting, []int64{w.seq})
		return err
	}); err != nil || !again {
		return err
	}
	dead, err := s.rerouteOnly(ctx, w.rec, st)
	if err != nil {
		return err
	}
	return s.routedFromWaiting(ctx, &w.waitingRow, w.topic, w.rec.Key, dead)
}

// rerouteOnly routes r again as its inbox outcome st says, without
// recording anything: to the retry topic of its stage (within the current
// ladder) or, when the outcome or the current policy says so (no retry
// topics), to the dead-letter topic. dead reports the latter.
func (s *dbScope) rerouteOnly(ctx context.Context, r *consumer.Record, st inboxStatus) (dead bool, err error) {
	meta := s.f.Metadata(r)
	attempt := max(1, st.attempt-meta.Attempt)
	pol := s.f.Policy()
	step := retrytopic.Step{Action: retrytopic.ActionDeadLetter, Class: consumer.ClassTerminal}
	if st.status == statusRetry && !pol.DisableRetryTopics && len(pol.Ladder) > 0 {
		stage := max(0, min(st.stage, len(pol.Ladder)-1))
		step = retrytopic.Step{Action: retrytopic.ActionRetryTopic, Class: consumer.ClassRetryable, Stage: stage,
			Delay: pol.Ladder[stage], Topic: retrytopic.RetryTopic(s.group, pol.Ladder[stage])}
	}
	return step.Action == retrytopic.ActionDeadLetter, s.f.Route(ctx, r, errRoutedAgain, step, attempt, time.Now())
}

func (s *dbScope) logRecover(ctx context.Context, err error) {
	if ctx.Err() == nil {
		s.log.Warn("kscope: releasing parked records failed; retrying later", "err", err)
	}
}

// routeMarks are the waiting rows (by id) that releases of this process
// are routing as their key's head.
type routeMarks struct {
	mu  sync.Mutex
	ids map[int64]int
}

func (m *routeMarks) add(seq int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ids == nil {
		m.ids = make(map[int64]int)
	}
	m.ids[seq]++
}

func (m *routeMarks) remove(seq int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ids[seq]--; m.ids[seq] <= 0 {
		delete(m.ids, seq)
	}
}

func (m *routeMarks) has(seq int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ids[seq] > 0
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
		if err := rows.Scan(&w.topic, &w.seq, &w.id, &kr.Key, &kr.Topic, &kr.Partition, &kr.Offset, &kr.Timestamp, &kr.Value, &keys, &vals, &w.version, &w.head, &w.since); err != nil {
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
