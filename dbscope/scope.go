package dbscope

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/retrytopic"
)

const (
	retryBase = 100 * time.Millisecond
	retryCap  = 30 * time.Second
)

// Stats are the DB scope's counters.
type Stats struct {
	Applied       int64 // records whose handler committed
	Duplicates    int64 // records skipped because their inbox row existed
	ReplaySkipped int64 // records skipped before the handler thanks to stored offsets
	Failed        int64 // handler failures (retried or dead-lettered by the failure policy)
	Skipped       int64 // records whose handler returned a business skip (their writes commit)
	TxRetries     int64 // transactions retried after a transient PostgreSQL error
	Transactions  int64 // transactions committed
}

// Runner is a consumer.Runner in the DB scope.
type Runner struct {
	*consumer.Runner
	s *scope
}

// DBStats returns the DB scope's counters.
func (r *Runner) DBStats() Stats {
	return Stats{
		Applied:       r.s.applied.Load(),
		Duplicates:    r.s.duplicates.Load(),
		ReplaySkipped: r.s.replaySkipped.Load(),
		Failed:        r.s.failed.Load(),
		Skipped:       r.s.skipped.Load(),
		TxRetries:     r.s.txRetries.Load(),
		Transactions:  r.s.transactions.Load(),
	}
}

// New returns a runner in the DB scope: every record's handler runs in a
// PostgreSQL transaction that also inserts the record's inbox row, and the
// record's Kafka offset is committed only after that transaction commits.
// A record whose inbox row already exists — a redelivery after a crash or a
// rebalance, a duplicate produce, a replay — is skipped without calling the
// handler and counted as a duplicate. Each record's database effect is
// therefore applied exactly once.
//
// A handler error rolls back that record alone (to its savepoint; the rest
// of its batch commits). The failure policy (consumer.Config.Failures) then
// retries it in place with backoff, or sends it to the dead-letter topic;
// later records of the same key wait behind it, other keys go on. A
// business skip (consumer.Skip) commits what the handler wrote and
// acknowledges the record. A transient PostgreSQL error (see [IsTransient])
// retries the whole batch. The offset is never committed past a record
// whose transaction did not commit or whose dead-letter produce was not
// acknowledged.
//
// Run [Migrate] first. What the DB scope does not cover: anything the
// handler does outside tx.
func New(cfg consumer.Config, o Options, h Handler) (*Runner, error) {
	if h == nil {
		return nil, &consumer.ConfigError{Struct: "dbscope", Field: "Handler", Reason: "is nil; pass the function that applies each record in its transaction"}
	}
	o = o.withDefaults(cfg)
	s := &scope{h: h, o: o}
	oerr := o.validate()
	r, err := consumer.NewRunner(cfg, s)
	if err = errors.Join(err, oerr); err != nil {
		return nil, err
	}
	s.init(r.Config())
	return &Runner{Runner: r, s: s}, nil
}

type scope struct {
	h      Handler
	o      Options
	log    *slog.Logger
	shards int

	sqlInbox, sqlForget, sqlOffset, sqlLoadOffsets string

	marksMu sync.Mutex
	marks   map[shardKey]int64 // next offset not known durable, per partition and shard

	applied, duplicates, replaySkipped atomic.Int64
	failed, txRetries, transactions    atomic.Int64
	skipped                            atomic.Int64

	f        *consumer.Failures
	identity consumer.Identity
}

// UseFailures implements consumer.FailureAware.
func (s *scope) UseFailures(f *consumer.Failures) { s.f = f }

type shardKey struct {
	topic     string
	partition int32
	shard     int
}

func (s *scope) init(cfg consumer.Config) {
	o := s.o
	s.identity = cfg.Identity
	s.log = cfg.Logger.With("group", cfg.Group, "scope", "db")
	s.shards = cfg.Shards
	s.marks = make(map[shardKey]int64)
	p := o.TablePrefix
	s.sqlInbox = `INSERT INTO ` + p + `inbox (consumer, message_id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING RETURNING message_id`
	s.sqlForget = `DELETE FROM ` + p + `inbox WHERE consumer = $1 AND message_id = ANY($2::text[])`
	s.sqlOffset = `INSERT INTO ` + p + `offsets AS o (consumer, topic, partition, shard, shards, next_offset)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (consumer, topic, partition, shard) DO UPDATE SET
			next_offset = CASE WHEN o.shards = EXCLUDED.shards THEN GREATEST(o.next_offset, EXCLUDED.next_offset) ELSE EXCLUDED.next_offset END,
			shards = EXCLUDED.shards,
			updated_at = now()`
	s.sqlLoadOffsets = `SELECT partition, shard, next_offset FROM ` + p + `offsets
		WHERE consumer = $1 AND topic = $2 AND shards = $3 AND partition = ANY($4::int[])`
}

// BatchLimits implements consumer.Batcher.
func (s *scope) BatchLimits() (int, time.Duration) { return s.o.BatchSize, s.o.BatchLinger }

// ClientOptions implements consumer.ClientOptioner: with StoreOffsets, the
// positions stored in the database are loaded on every assignment.
func (s *scope) ClientOptions() []kgo.Opt {
	if !s.o.StoreOffsets {
		return nil
	}
	return []kgo.Opt{kgo.AdjustFetchOffsetsFn(s.adjustOffsets)}
}

// RunBackground implements consumer.Background: inbox retention.
func (s *scope) RunBackground(ctx context.Context) {
	if s.o.InboxTTL <= 0 {
		return
	}
	t := time.NewTicker(s.o.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n, err := CleanupInbox(ctx, s.o.Pool, CleanupOptions{
				TablePrefix: s.o.TablePrefix, Consumer: s.o.Consumer, TTL: s.o.InboxTTL, Batch: s.o.CleanupBatch,
			})
			if err != nil && ctx.Err() == nil {
				s.log.Warn("kscope: inbox cleanup failed; retrying at the next interval", "err", err)
			} else if n > 0 {
				s.log.Debug("kscope: inbox cleanup", "deleted", n)
			}
		}
	}
}

// adjustOffsets loads the stored positions of newly assigned partitions and
// moves the fetch start ahead of the committed Kafka offset when every shard
// has applied past it.
func (s *scope) adjustOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	for topic, parts := range offsets {
		ids := make([]int32, 0, len(parts))
		for p := range parts {
			ids = append(ids, p)
		}
		rows, err := s.o.Pool.Query(ctx, s.sqlLoadOffsets, s.o.Consumer, topic, s.shards, ids)
		if err != nil {
			return nil, fmt.Errorf("kscope: loading stored offsets of %s: %w", topic, err)
		}
		perPart := make(map[int32][]int64)
		s.marksMu.Lock()
		for rows.Next() {
			var p int32
			var shard int
			var next int64
			if err := rows.Scan(&p, &shard, &next); err != nil {
				rows.Close()
				s.marksMu.Unlock()
				return nil, err
			}
			s.marks[shardKey{topic, p, shard}] = next
			perPart[p] = append(perPart[p], next)
		}
		s.marksMu.Unlock()
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("kscope: loading stored offsets of %s: %w", topic, err)
		}
		for p, nexts := range perPart {
			if len(nexts) != s.shards {
				continue // a shard with no row may hold an unapplied record anywhere
			}
			resume := nexts[0]
			for _, n := range nexts[1:] {
				resume = min(resume, n)
			}
			if committed := parts[p].EpochOffset().Offset; committed < resume {
				parts[p] = kgo.NewOffset().At(resume)
				s.log.Info("kscope: resuming from the offset stored in the database", "topic", topic, "partition", p, "offset", resume, "kafka_committed", committed)
			}
		}
	}
	return offsets, nil
}

func (s *scope) mark(r *consumer.Record) (int64, bool) {
	s.marksMu.Lock()
	defer s.marksMu.Unlock()
	m, ok := s.marks[shardKey{r.Topic, r.Partition, r.Shard()}]
	return m, ok
}

type outcome uint8

const (
	toApply outcome = iota
	applied
	skipped
	duplicate
	failedOutcome
	deferred
)

var errIsolate = errors.New("dbscope: a handler failed; rerun the batch with a savepoint per record")

// failure is what is known of one record's failures in this Process call.
type failure struct {
	attempts int
	first    time.Time
	err      error
}

// Process implements consumer.Scope.
func (s *scope) Process(ctx context.Context, batch []*consumer.Record, done func(*consumer.Record)) {
	pending := batch
	isolate := false
	fails := map[*consumer.Record]*failure{}
	for attempt := 0; len(pending) > 0; {
		if ctx.Err() != nil || pending[0].Revoked() {
			return
		}
		rest, failed, err := s.apply(ctx, pending, done, isolate)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			attempt++
			s.txRetries.Add(1)
			d := backoff.Delay(attempt, retryBase, retryCap)
			s.log.Warn("kscope: transaction failed; retrying the batch", "err", err, "records", len(pending),
				"topic", pending[0].Topic, "partition", pending[0].Partition, "first_offset", pending[0].Offset, "attempt", attempt, "retry_in", d)
			if !backoff.Sleep(ctx, d) {
				return
			}
			continue
		}
		attempt = 0
		// Records whose handler failed: the failure policy decides. A
		// record it acknowledges (skipped, dead-lettered) is done; the
		// later records of its key then go on.
		var wait time.Duration
		kept := rest[:0:0]
		for _, r := range rest {
			herr, ok := failed[r]
			if !ok {
				kept = append(kept, r) // deferred behind a failure of its key
				continue
			}
			fi := fails[r]
			if fi == nil {
				fi = &failure{first: time.Now()}
				fails[r] = fi
			}
			fi.attempts++
			step, ferr := s.f.Handle(ctx, r, herr, fi.attempts, fi.first)
			if ferr != nil {
				return // ctx done while routing: not done, redelivered
			}
			if step.Action != retrytopic.ActionRetry {
				done(r)
				continue
			}
			kept = append(kept, r)
			if wait == 0 || step.Delay < wait {
				wait = step.Delay
			}
		}
		if len(kept) == 0 {
			return
		}
		// What is left goes again, in order, each record in a savepoint of
		// its own.
		pending, isolate = kept, true
		if wait > 0 && !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// apply runs one transaction over recs and calls done for every record it
// made durable (applied, skipped or found duplicate), in order. It returns
// the records still to do: those whose handler failed (with their errors in
// failed) and later records of their keys. A non-nil error means the
// transaction did not commit.
func (s *scope) apply(ctx context.Context, recs []*consumer.Record, done func(*consumer.Record), isolate bool) ([]*consumer.Record, map[*consumer.Record]error, error) {
	work := recs[:0:0]
	if s.o.StoreOffsets {
		for _, r := range recs {
			if m, ok := s.mark(r); ok && r.Offset < m {
				s.replaySkipped.Add(1)
				done(r)
				continue
			}
			work = append(work, r)
		}
	} else {
		work = recs
	}
	if len(work) == 0 {
		return nil, nil, nil
	}
	ids := make([]string, len(work))
	for i, r := range work {
		ids[i] = s.identity.Of(r)
	}
	out, errs, err := s.runTx(ctx, work, ids, isolate)
	if errors.Is(err, errIsolate) {
		out, errs, err = s.runTx(ctx, work, ids, true)
	}
	if err != nil {
		return nil, nil, err
	}
	s.transactions.Add(1)
	var rest []*consumer.Record
	var failed map[*consumer.Record]error
	for i, r := range work {
		switch out[i] {
		case applied:
			s.applied.Add(1)
			done(r)
		case skipped:
			s.skipped.Add(1)
			done(r)
		case duplicate:
			s.duplicates.Add(1)
			done(r)
		case failedOutcome:
			if failed == nil {
				failed = make(map[*consumer.Record]error)
			}
			failed[r] = errs[i]
			rest = append(rest, r)
		default:
			rest = append(rest, r)
		}
	}
	return rest, failed, nil
}

func (s *scope) runTx(ctx context.Context, work []*consumer.Record, ids []string, isolate bool) (out []outcome, errs []error, err error) {
	tx, err := s.o.Pool.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	out = make([]outcome, len(work))
	errs = make([]error, len(work))
	fresh := make(map[string]bool, len(ids))
	rows, err := tx.Query(ctx, s.sqlInbox, s.o.Consumer, ids)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, nil, err
		}
		fresh[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	for i, id := range ids {
		if fresh[id] {
			out[i] = toApply
			delete(fresh, id) // a second record with this id in the batch is a duplicate
		} else {
			out[i] = duplicate
		}
	}

	var blocked map[string]bool
	blockedNull := false
	var undo []string
	for i, r := range work {
		if out[i] != toApply {
			continue
		}
		if (r.Key == nil && blockedNull) || (r.Key != nil && blocked[string(r.Key)]) {
			out[i] = deferred
			undo = append(undo, ids[i])
			continue
		}
		if !isolate {
			if err := s.call(ctx, tx, r); err != nil {
				if IsTransient(err) || tx.Conn().IsClosed() {
					return nil, nil, err
				}
				if s.f.Class(err) != consumer.ClassSkip {
					return nil, nil, errIsolate
				}
				out[i] = skipped
				continue
			}
			out[i] = applied
			continue
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return nil, nil, err
		}
		if herr := s.call(ctx, sp, r); herr != nil {
			if IsTransient(herr) || tx.Conn().IsClosed() {
				return nil, nil, herr
			}
			if s.f.Class(herr) == consumer.ClassSkip {
				// A business outcome: what the handler wrote stays.
				if err := sp.Commit(ctx); err != nil {
					return nil, nil, err
				}
				out[i] = skipped
				continue
			}
			if err := sp.Rollback(ctx); err != nil {
				return nil, nil, err
			}
			s.failed.Add(1)
			out[i] = failedOutcome
			errs[i] = herr
			undo = append(undo, ids[i])
			if r.Key == nil {
				blockedNull = true
			} else {
				if blocked == nil {
					blocked = make(map[string]bool)
				}
				blocked[string(r.Key)] = true
			}
			continue
		}
		if err := sp.Commit(ctx); err != nil {
			return nil, nil, err
		}
		out[i] = applied
	}
	if len(undo) > 0 {
		if _, err := tx.Exec(ctx, s.sqlForget, s.o.Consumer, undo); err != nil {
			return nil, nil, err
		}
	}
	if s.o.StoreOffsets {
		k := 0
		for k < len(work) && (out[k] == applied || out[k] == skipped || out[k] == duplicate) {
			k++
		}
		if k > 0 {
			r := work[k-1]
			if _, err := tx.Exec(ctx, s.sqlOffset, s.o.Consumer, r.Topic, r.Partition, r.Shard(), s.shards, r.Offset+1); err != nil {
				return nil, nil, err
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, err
	}
	return out, errs, nil
}

// call runs the handler and turns a panic into an error.
func (s *scope) call(ctx context.Context, tx pgx.Tx, r *consumer.Record) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("kscope: handler panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return s.h.Handle(ctx, tx, r)
}

func logKey(k []byte) string {
	if len(k) > 64 {
		k = k[:64]
	}
	return string(k)
}
