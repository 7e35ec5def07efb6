package dbscope

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
)

// Inbox statuses: what the inbox remembers of an identity's outcome.
const (
	statusApplied = "applied" // applied, skipped or stale
	statusParked  = "parked"  // waiting in PostgreSQL behind its key's head
	statusRetry   = "retry"   // in the retry topics: only the hop of its attempt count runs it
	statusDLT     = "dlt"     // going to the dead-letter topic
	statusDead    = "dead"    // the dead-letter topic acknowledged it
	// statusResolved is written by kscope dlt skip: an operator gave the
	// dead letter up. Done, even for a copy redriven from the DLT.
	statusResolved = "resolved"
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
func (s *dbScope) waitArgs(topic string, r *consumer.Record, id string, version int64) []any {
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
	since   time.Time // when it was stored: it has waited behind its key's head since then
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
		if err := rows.Scan(&w.seq, &w.id, &kr.Key, &kr.Topic, &kr.Partition, &kr.Offset, &kr.Timestamp, &kr.Value, &keys, &vals, &w.version, &w.head, &w.since); err != nil {
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
// the retry topics, or the dead-letter topic. dead reports that it went
// to the dead-letter topic.
func (s *dbScope) reroute(ctx context.Context, r *consumer.Record, st inboxStatus) (dead bool, err error) {
	if dead, err = s.rerouteOnly(ctx, r, st); err != nil || !dead {
		return dead, err
	}
	return true, s.markDead(ctx, s.identity.Of(r), s.f.Metadata(r).OriginalTopic, r.Key)
}

// markDead records that the dead-letter topic acknowledged the record of
// identity id: its inbox row says so, and its key (if it held one back) is
// released.
func (s *dbScope) markDead(ctx context.Context, id, topic string, key []byte) error {
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
// retry loop (scope.Failures.Rounds): a failed transaction is retried
// after a growing backoff; only a done ctx stops it.
func (s *dbScope) retryTx(ctx context.Context, fn func(pgx.Tx) error) error {
	var violation error
	if s.f.Rounds(ctx, nil, func() round {
		if err := pgx.BeginFunc(ctx, s.o.Pool, fn); err != nil {
			if ctx.Err() != nil {
				return round{Stop: true}
			}
			var cv *commitViolation
			if errors.As(err, &cv) {
				violation = cv // the caller runs fewer records (release)
				return round{}
			}
			s.txRetries.Add(1)
			return round{More: true, Err: err, Held: s.deployment(err)}
		}
		s.transactions.Add(1)
		return round{}
	}) {
		return violation
	}
	return ctx.Err()
}
