package dbscope

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/partition"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
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
	Skipped       int64 // records whose handler returned a business skip (their writes commit unless a failed statement aborted them)
	Parked        int64 // records sent behind an earlier record of their key that is in the retry topics
	Stale         int64 // records whose version was at or below their key's last applied one: skipped
	GapsDetected  int64 // records found ahead of their key's next version
	GapsHealed    int64 // records applied after waiting for the versions before them
	GapsAccepted  int64 // records applied over a gap (sequence.Accept)
	GapsTimedOut  int64 // records that waited past GapTimeout and went to the DLT
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
		Parked:        r.s.parked.Load(),
		Stale:         r.s.stale.Load(),
		GapsDetected:  r.s.gapsDetected.Load(),
		GapsHealed:    r.s.gapsHealed.Load(),
		GapsAccepted:  r.s.gapsAccepted.Load(),
		GapsTimedOut:  r.s.gapsTimedOut.Load(),
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
// of its batch commits, without their handlers running again). The failure
// policy (consumer.Config.Failures) then retries it in place with backoff,
// sends it to a retry topic or to the dead-letter topic; later records of
// the same key wait behind it, other keys go on. A business skip
// (consumer.Skip) commits what the handler wrote and acknowledges the
// record, unless a statement of the handler failed and left the
// transaction aborted: then its writes are rolled back (see [Handler]). A
// transient PostgreSQL error (see [IsTransient]) raised by a record's
// statement rolls that record back and commits the records before it; it
// is retried after a backoff, so a batch makes progress while its records
// fail transiently one by one (a statement timeout, say). A lost
// connection retries the whole transaction. An error the handler marked
// with a class follows the failure policy, whatever it wraps. The offset
// is never committed past a record whose transaction did not commit or
// whose dead-letter produce was not acknowledged.
//
// Run [Migrate] first: Run fails at start with a [*SchemaError] when
// kscope's tables are missing or older than this version. What the DB
// scope does not cover: anything the handler does outside tx.
func New(cfg consumer.Config, o Options, h Handler) (*Runner, error) {
	if h == nil {
		return nil, &consumer.ConfigError{Struct: "dbscope", Field: "Handler", Reason: "is nil; pass the function that applies each record in its transaction"}
	}
	return newRunner(cfg, o, h, nil)
}

// newRunner builds a DB-scope runner around a Handler or a QueueHandler.
func newRunner(cfg consumer.Config, o Options, h Handler, qh QueueHandler) (*Runner, error) {
	o = o.withDefaults(cfg)
	s := &scope{h: h, qh: qh, o: o, useTopics: !cfg.Failures.DisableRetryTopics}
	oerr := o.validate()
	if o.Versions != nil && cfg.Failures.Unordered {
		oerr = errors.Join(oerr, &consumer.ConfigError{Struct: "dbscope.Options", Field: "Versions",
			Reason: "is set with Config.Failures.Unordered; versions are applied in per-key order, so unset one of them"})
	}
	r, err := consumer.NewRunner(cfg, s)
	if err = errors.Join(err, oerr); err != nil {
		return nil, err
	}
	s.init(r.Config())
	return &Runner{Runner: r, s: s}, nil
}

type scope struct {
	h      Handler
	qh     QueueHandler // instead of h: the handler queues its statements
	o      Options
	log    *slog.Logger
	shards int
	// routing names how records are routed to key-shards (see routingOf):
	// stored positions are used only under the routing they were written
	// under.
	routing string

	sqlInbox, sqlForget, sqlOffset, sqlLoadOffsets string
	sqlLoadParked, sqlPark, sqlUnpark              string
	sqlLoadVersion, sqlSaveVersion                 string
	sqlLockKeys, sqlStatus, sqlOneStatus           string
	sqlSetStatus, sqlCountHeads, sqlWait           string
	sqlLoadWaitingKeys, sqlLoadWaitingRows         string
	sqlBusyKeys                                    string
	sqlWaitingHead, sqlDeleteWaiting               string
	sqlLoadWaitingHeads, sqlOrphanKeys             string

	marksMu sync.Mutex
	marks   map[shardKey]int64 // next offset not known durable, per partition and shard

	applied, duplicates, replaySkipped atomic.Int64
	failed, txRetries, transactions    atomic.Int64
	skipped, parked                    atomic.Int64
	stale, gapsDetected, gapsHealed    atomic.Int64
	gapsAccepted, gapsTimedOut         atomic.Int64
	group                              string

	f         *consumer.Failures
	identity  consumer.Identity
	useTopics bool
}

// UseFailures implements consumer.FailureAware.
func (s *scope) UseFailures(f *consumer.Failures) { s.f = f }

// UsesRetryTopics implements consumer.RetryTopicUser.
func (s *scope) UsesRetryTopics() bool { return s.useTopics }

type shardKey struct {
	topic     string
	partition int32
	shard     int
}

func (s *scope) init(cfg consumer.Config) {
	o := s.o
	s.identity = cfg.Identity
	s.group = cfg.Group
	s.log = cfg.Logger.With("group", cfg.Group, "scope", "db")
	s.shards = cfg.Shards
	s.marks = make(map[shardKey]int64)
	p := o.TablePrefix
	s.sqlInbox = `INSERT INTO ` + p + `inbox (consumer, message_id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING RETURNING message_id`
	s.sqlForget = `DELETE FROM ` + p + `inbox WHERE consumer = $1 AND message_id = ANY($2::text[])`
	s.sqlOffset = `INSERT INTO ` + p + `offsets AS o (consumer, topic, partition, shard, shards, next_offset, routing)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (consumer, topic, partition, shard) DO UPDATE SET
			next_offset = CASE WHEN o.routing = EXCLUDED.routing THEN GREATEST(o.next_offset, EXCLUDED.next_offset) ELSE EXCLUDED.next_offset END,
			shards = EXCLUDED.shards,
			routing = EXCLUDED.routing,
			updated_at = now()`
	s.sqlLoadParked = `SELECT topic, key, message_id, original_offset, stage, coalesce(version, 0) FROM ` + p + `parked
		WHERE consumer = $1 AND (topic, key) IN (SELECT * FROM unnest($2::text[], $3::bytea[]))`
	s.sqlPark = `INSERT INTO ` + p + `parked (consumer, topic, key, message_id, original_offset, stage, version)
		VALUES ($1, $2, $3, $4, $5, $6, NULLIF($7, 0))
		ON CONFLICT (consumer, topic, key, message_id) DO UPDATE SET stage = EXCLUDED.stage`
	s.sqlLoadVersion = `SELECT version FROM ` + p + `key_versions WHERE consumer = $1 AND topic = $2 AND key = $3 FOR UPDATE`
	s.sqlSaveVersion = `INSERT INTO ` + p + `key_versions AS v (consumer, topic, key, version) VALUES ($1, $2, $3, $4)
		ON CONFLICT (consumer, topic, key) DO UPDATE SET version = EXCLUDED.version, updated_at = now()`
	s.sqlUnpark = `DELETE FROM ` + p + `parked WHERE consumer = $1 AND topic = $2 AND key = $3 AND message_id = $4`
	s.sqlLoadOffsets = `SELECT partition, shard, next_offset FROM ` + p + `offsets
		WHERE consumer = $1 AND topic = $2 AND routing = $3 AND partition = ANY($4::int[])`
	s.routing = routingOf(cfg.Shards, cfg.NullKeys)
	s.sqlLockKeys = `SELECT pg_advisory_xact_lock(h) FROM (SELECT DISTINCT hashtextextended($1 || '/' || t || '/' || encode(k, 'hex'), 0) AS h
		FROM unnest($2::text[], $3::bytea[]) AS x(t, k) ORDER BY 1) AS s`
	s.sqlStatus = `SELECT message_id, status, attempt, stage, via FROM ` + p + `inbox
		WHERE consumer = $1 AND message_id = ANY($2::text[]) AND status <> 'applied' FOR UPDATE`
	s.sqlOneStatus = `SELECT status, attempt, stage, via FROM ` + p + `inbox WHERE consumer = $1 AND message_id = $2`
	s.sqlSetStatus = `UPDATE ` + p + `inbox AS i SET status = u.status, attempt = u.attempt, stage = u.stage, via = u.via
		FROM unnest($2::text[], $3::text[], $4::int[], $5::int[], $6::text[]) AS u(id, status, attempt, stage, via)
		WHERE i.consumer = $1 AND i.message_id = u.id`
	s.sqlCountHeads = `SELECT count(*) FROM ` + p + `parked WHERE consumer = $1 AND topic = $2 AND key = $3`
	s.sqlWait = `INSERT INTO ` + p + `waiting (consumer, topic, key, message_id, src_topic, src_partition, src_offset, ts, value, header_keys, header_values, version)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`
	s.sqlLoadWaitingKeys = `SELECT DISTINCT topic, key FROM ` + p + `waiting
		WHERE consumer = $1 AND (topic, key) IN (SELECT * FROM unnest($2::text[], $3::bytea[]))`
	s.sqlBusyKeys = `SELECT DISTINCT x.t, x.k FROM unnest($2::text[], $3::bytea[]) AS x(t, k)
		WHERE EXISTS (SELECT 1 FROM ` + p + `parked WHERE consumer = $1 AND topic = x.t AND key = x.k)
		   OR EXISTS (SELECT 1 FROM ` + p + `waiting WHERE consumer = $1 AND topic = x.t AND key = x.k)`
	const waitingCols = `id, message_id, key, src_topic, src_partition, src_offset, ts, value, header_keys, header_values, version, head`
	s.sqlLoadWaitingRows = `SELECT ` + waitingCols + ` FROM ` + p + `waiting
		WHERE consumer = $1 AND topic = $2 AND key = $3 ORDER BY version NULLS FIRST, id LIMIT $4 FOR UPDATE`
	s.sqlWaitingHead = `UPDATE ` + p + `waiting SET head = true WHERE id = $1`
	s.sqlDeleteWaiting = `DELETE FROM ` + p + `waiting WHERE id = ANY($1::bigint[])`
	s.sqlLoadWaitingHeads = `SELECT topic, ` + waitingCols + ` FROM ` + p + `waiting WHERE consumer = $1 AND head ORDER BY id`
	s.sqlOrphanKeys = `SELECT DISTINCT w.topic, w.key FROM ` + p + `waiting AS w WHERE w.consumer = $1 AND NOT w.head
		AND NOT EXISTS (SELECT 1 FROM ` + p + `parked AS k WHERE k.consumer = w.consumer AND k.topic = w.topic AND k.key = w.key)`
}

// Start implements consumer.Starter: Run fails at once with a
// [*SchemaError], which says to run [Migrate], when the database lacks
// kscope's tables or a migration of this version. A transient error (the
// database not reachable yet) is retried with backoff; any other error of
// the check is logged and the runner starts, as it did before the check.
func (s *scope) Start(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := checkSchema(ctx, s.o.Pool, s.o.TablePrefix)
		var se *SchemaError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &se):
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		case !IsTransient(err):
			s.log.Warn("kscope: could not check kscope's tables; starting anyway", "err", err)
			return nil
		}
		d := backoff.Delay(attempt, retryBase, retryCap)
		s.log.Warn("kscope: checking kscope's tables failed; retrying", "err", err, "attempt", attempt, "retry_in", d)
		if !backoff.Sleep(ctx, d) {
			return ctx.Err()
		}
	}
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

// RunBackground implements consumer.Background: inbox retention and, in
// an ordered pipeline, the release of parked records a stopped process
// left behind.
func (s *scope) RunBackground(ctx context.Context) {
	var cleanup, release <-chan time.Time
	if s.o.InboxTTL > 0 {
		t := time.NewTicker(s.o.CleanupInterval)
		defer t.Stop()
		cleanup = t.C
	}
	if s.ordered() {
		s.recoverParking(ctx, true)
		t := time.NewTicker(releaseInterval)
		defer t.Stop()
		release = t.C
	}
	if cleanup == nil && release == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-release:
			s.recoverParking(ctx, false)
		case <-cleanup:
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
		rows, err := s.o.Pool.Query(ctx, s.sqlLoadOffsets, s.o.Consumer, topic, s.routing, ids)
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

// routingOf names the routing of records to key-shards under shards and
// nullKeys: the shard count, the null-key policy, and a digest of the
// shards the routing hash gives a fixed set of records, which changes if
// the hash itself does. A stored position says which records routed to its
// shard are durable, so it holds only under the routing it was written
// under.
func routingOf(shards int, nullKeys consumer.NullKeyPolicy) string {
	h := fnv.New64a()
	th := partition.HashTopic("kscope-routing-probe")
	for p := range int32(4) {
		for off := range int64(8) {
			for k := range 9 {
				var key []byte
				if k > 0 {
					key = []byte{'k', byte(k), byte(off)}
				}
				binary.Write(h, binary.LittleEndian, int32(th.Shard(p, off, key, shards, nullKeys))) //nolint:errcheck // hashes do not fail
			}
		}
	}
	return fmt.Sprintf("shards=%d nullkeys=%s hash=%016x", shards, nullKeys, h.Sum64())
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
	parkedOutcome
	staleOutcome
	deferred
	notTried       // the transaction ended before the record: it goes in the next one
	rerouteOutcome // the copy that was being routed when the process stopped: routed again
)

// gapNote says what a record's transaction did about a version gap.
type gapNote uint8

const (
	noGap       gapNote = iota
	gapDetected         // first found: the record waits in the retry topics
	gapWaiting          // still waiting
	gapHealed           // the missing versions came: applied
	gapAccepted         // applied over the gap (sequence.Accept)
	gapTimedOut         // waited past GapTimeout: to the DLT
	gapDead             // sequence.DeadLetter: to the DLT at once
)

// isolateError says that a queued statement of record i failed: the
// transaction is run again without record i's statements, record i taking
// err as its failure (no handler is called again).
type isolateError struct {
	i   int
	err error
}

func (e *isolateError) Error() string {
	return "dbscope: a queued statement failed; rerun the batch without its record: " + e.err.Error()
}

// transientError is a transient error raised by a queued statement of
// record rec, or a connection lost under its handler: the transaction is
// rolled back and retried, and the records before rec, which succeeded in
// it, are retried on their own first.
type transientError struct {
	rec *consumer.Record
	err error
}

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// errConnLost is a record's failure when the connection was lost under its
// handler without the handler reporting it.
var errConnLost = errors.New("dbscope: the connection to PostgreSQL was lost")

// errAborted is the failure of a record whose handler returned nil but
// left the transaction aborted.
var errAborted = errors.New("dbscope: the handler returned nil, but a statement it ran failed and left the transaction aborted, so its writes were rolled back; return the statement's error, or run the statement that may fail in a nested transaction (tx.Begin)")

// lostWrites is added to the error of a business skip that left the
// transaction aborted.
const lostWrites = "dbscope: the record is skipped, but a statement its handler ran failed and left the transaction aborted, so its writes were rolled back"

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
	err       error           // failedOutcome: the handler's error; skipped: a note on lost writes
	step      retrytopic.Step // failedOutcome: what the failure policy decided
	st        inboxStatus     // rerouteOutcome: the outcome to route again
	release   bool            // the record was its key's head: the key's waiting records are released
}

// Process implements consumer.Scope.
func (s *scope) Process(ctx context.Context, batch []*consumer.Record, done func(*consumer.Record)) {
	obs := s.f.Observer()
	for _, r := range batch {
		obs.Start(ctx, r)
	}
	defer func() {
		for _, r := range batch {
			obs.End(r, consumer.OutcomeAborted, nil) // a no-op for the records that ended
		}
	}()
	pending := batch
	limit := s.txLimit(len(pending)) // the next transaction takes pending[:limit]
	fails := map[*consumer.Record]*failure{}
	var calls map[*consumer.Record]*queuedCall
	if s.qh != nil {
		calls = make(map[*consumer.Record]*queuedCall, len(batch))
	}
	for attempt := 0; len(pending) > 0; {
		if ctx.Err() != nil || pending[0].Revoked() {
			return
		}
		work, res, stop, err := s.apply(ctx, pending[:limit], done, fails, calls)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var te *transientError
			if errors.As(err, &te) {
				delete(calls, te.rec) // its statement failed: its handler runs again
				if cut := slices.Index(pending[:limit], te.rec); cut > 0 {
					limit = cut
				}
			}
			attempt++
			s.txRetries.Add(1)
			d := backoff.Delay(attempt, retryBase, retryCap)
			s.log.Warn("kscope: transaction failed; retrying the batch", "err", err, "records", limit,
				"topic", pending[0].Topic, "partition", pending[0].Partition, "first_offset", pending[0].Offset, "attempt", attempt, "retry_in", d)
			done(nil) // what is durable may commit while the batch waits
			if !backoff.SleepOr(ctx, d, pending[0].RevokedCh()) {
				return
			}
			continue
		}
		rest := pending[limit:] // after a transient failure: not tried yet
		// The transaction committed. Carry out what it decided for the
		// records that did not apply: a parked record is stored in
		// PostgreSQL and done; a failed one is retried in place, sent to a
		// retry topic or dead-lettered, and done once the broker has it.
		// A key whose head resolved has its waiting records released.
		var wait time.Duration
		var kept []*consumer.Record
		type heldKey struct {
			topic string
			key   []byte
		}
		var release []heldKey
		for i, r := range work {
			if res[i].release {
				release = append(release, heldKey{s.f.Metadata(r).OriginalTopic, r.Key})
			}
			switch res[i].out {
			case parkedOutcome:
				obs.End(r, consumer.OutcomeParked, nil)
				done(r)
			case rerouteOutcome:
				if err := s.reroute(ctx, r, res[i].st); err != nil {
					return
				}
				if res[i].st.status == statusDLT && r.Key != nil && s.ordered() {
					release = append(release, heldKey{s.f.Metadata(r).OriginalTopic, r.Key})
				}
				obs.End(r, consumer.OutcomeDuplicate, nil)
				done(r)
			case failedOutcome:
				delete(calls, r) // its next attempt calls the handler again
				fi := fails[r]
				if fi == nil {
					fi = &failure{first: time.Now()}
					fails[r] = fi
				}
				fi.attempts++
				step := res[i].step
				if err := s.f.Route(ctx, r, res[i].err, step, fi.attempts, fi.first); err != nil {
					return // ctx done while routing: not done, redelivered
				}
				if step.Action == retrytopic.ActionDeadLetter {
					// The DLT has it: the inbox remembers it, and its key's
					// waiting records go on.
					meta := s.f.Metadata(r)
					if err := s.markDead(ctx, s.identity.Of(r), meta.OriginalTopic, r.Key); err != nil {
						return
					}
					if r.Key != nil && s.ordered() {
						release = append(release, heldKey{meta.OriginalTopic, r.Key})
					}
				}
				if step.Action != retrytopic.ActionRetry {
					out := consumer.OutcomeOf(step.Action)
					if g := res[i].gap; (g == gapDetected || g == gapWaiting) && step.Action == retrytopic.ActionRetryTopic {
						out = consumer.OutcomeGap
					}
					obs.End(r, out, res[i].err)
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
		for _, k := range release {
			if err := s.release(ctx, k.topic, k.key); err != nil {
				return
			}
		}
		if stop != nil {
			delete(calls, stop.rec) // its next attempt calls the handler again
			// A record's handler failed transiently (a statement
			// timeout, a deadlock): the records before it committed, and
			// it goes again, with the rest, after a backoff. The backoff
			// grows only while the same record fails first: when records
			// before it committed, the batch made progress and it starts
			// over, so a batch whose records time out one by one is not
			// slowed down more and more.
			if len(pending) > 0 && stop.rec != pending[0] {
				attempt = 0
			}
			attempt++
			s.txRetries.Add(1)
			d := backoff.Delay(attempt, retryBase, retryCap)
			s.log.Warn("kscope: a record failed transiently; the records before it committed, retrying from it", "err", stop.err,
				"topic", stop.rec.Topic, "partition", stop.rec.Partition, "offset", stop.rec.Offset, "attempt", attempt, "retry_in", d)
			wait = max(wait, d)
		} else {
			attempt = 0
		}
		if len(kept) == 0 && len(rest) == 0 {
			return
		}
		// What is left goes again, in order: the records kept for a retry
		// in place, those deferred behind them and those the transaction
		// did not reach, with the rest of the batch behind them.
		pending = append(kept, rest...)
		limit = s.txLimit(len(pending))
		done(nil) // what is durable may commit while the rest waits
		if wait > 0 && !backoff.SleepOr(ctx, wait, pending[0].RevokedCh()) {
			return
		}
	}
}

// txLimit returns how many of n pending records the next transaction
// takes: all of them for a QueueHandler, at most maxSavepoints for a
// Handler, each of whose records may take a savepoint. (Records left out
// would have their inbox rows inserted and deleted again.)
func (s *scope) txLimit(n int) int {
	if s.qh == nil {
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
func (s *scope) apply(ctx context.Context, recs []*consumer.Record, done func(*consumer.Record), fails map[*consumer.Record]*failure, calls map[*consumer.Record]*queuedCall) ([]*consumer.Record, []result, *transientError, error) {
	work := recs[:0:0]
	if s.o.StoreOffsets {
		for _, r := range recs {
			if m, ok := s.mark(r); ok && r.Offset < m {
				s.replaySkipped.Add(1)
				s.f.Observer().End(r, consumer.OutcomeDuplicate, nil)
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
	// A queued statement that fails aborts the transaction: it runs again
	// without that record's statements, each of which fails its record.
	var known map[int]error
	var res []result
	var stop *transientError
	var err error
	for {
		res, stop, err = s.runTx(ctx, work, ids, fails, calls, known)
		var ie *isolateError
		if !errors.As(err, &ie) || known[ie.i] != nil {
			break
		}
		if known == nil {
			known = make(map[int]error)
		}
		known[ie.i] = ie.err
	}
	if err != nil {
		return nil, nil, nil, err
	}
	s.transactions.Add(1)
	obs := s.f.Observer()
	for i, r := range work {
		switch res[i].gap {
		case gapDetected, gapAccepted, gapDead:
			obs.Event(r, consumer.EventVersionGap, res[i].gapDetail)
		case gapHealed:
			obs.Event(r, consumer.EventVersionHeal, "")
		}
		switch res[i].out {
		case applied:
			s.applied.Add(1)
			obs.End(r, consumer.OutcomeSuccess, nil)
			done(r)
		case skipped:
			s.skipped.Add(1)
			if res[i].err != nil {
				s.log.Warn("kscope: record skipped without its writes", "err", res[i].err,
					"topic", r.Topic, "partition", r.Partition, "offset", r.Offset)
			}
			obs.End(r, consumer.OutcomeSkipped, res[i].err)
			done(r)
		case duplicate:
			s.duplicates.Add(1)
			obs.Event(r, consumer.EventDuplicate, "")
			obs.End(r, consumer.OutcomeDuplicate, nil)
			done(r)
		case staleOutcome:
			s.stale.Add(1)
			obs.End(r, consumer.OutcomeStale, nil)
			done(r)
		case failedOutcome:
			s.failed.Add(1)
		case parkedOutcome:
			s.parked.Add(1)
		}
		switch res[i].gap {
		case gapDetected:
			s.gapsDetected.Add(1)
		case gapHealed:
			s.gapsHealed.Add(1)
		case gapAccepted:
			s.gapsDetected.Add(1)
			s.gapsAccepted.Add(1)
		case gapTimedOut:
			s.gapsTimedOut.Add(1)
		case gapDead:
			s.gapsDetected.Add(1)
		}
	}
	return work, res, stop, nil
}

// parkRow is a row of the parked table.
type parkRow struct {
	id      string
	offset  int64
	stage   int
	version int64 // 0 when versions are not checked
}

// pairKey names a (original topic, key) pair.
type pairKey struct{ topic, key string }

// parking is the parked state of the keys of one transaction's records, as
// read at its start and changed by it.
type parking map[pairKey][]parkRow

func (p parking) head(k pairKey) (parkRow, bool) {
	rows := p[k]
	if len(rows) == 0 {
		return parkRow{}, false
	}
	h := rows[0]
	for _, r := range rows[1:] {
		if r.offset < h.offset {
			h = r
		}
	}
	return h, true
}

func (p parking) has(k pairKey, id string) bool {
	for _, r := range p[k] {
		if r.id == id {
			return true
		}
	}
	return false
}

func (p parking) set(k pairKey, row parkRow) {
	for i, r := range p[k] {
		if r.id == row.id {
			p[k][i] = row
			return
		}
	}
	p[k] = append(p[k], row)
}

func (p parking) remove(k pairKey, id string) {
	rows := p[k]
	for i, r := range rows {
		if r.id == id {
			p[k] = append(rows[:i], rows[i+1:]...)
			return
		}
	}
}

// ordered reports whether later records of a key wait behind one that is in
// the retry topics.
func (s *scope) ordered() bool {
	p := s.f.Policy()
	return !p.Unordered && !p.DisableRetryTopics && len(p.Ladder) > 0
}

// parkedKeys returns the (original topic, key) pairs of the keyed records of
// work, whose parked rows the transaction reads.
func parkedKeys(work []*consumer.Record, metas []retrytopic.Metadata) (topics []string, keys [][]byte) {
	for i, r := range work {
		if r.Key != nil {
			topics = append(topics, metas[i].OriginalTopic)
			keys = append(keys, r.Key)
		}
	}
	return topics, keys
}

// scanParking reads the rows of sqlLoadParked.
func scanParking(rows pgx.Rows) (parking, error) {
	defer rows.Close()
	p := parking{}
	for rows.Next() {
		var topic string
		var key []byte
		var row parkRow
		if err := rows.Scan(&topic, &key, &row.id, &row.offset, &row.stage, &row.version); err != nil {
			return nil, err
		}
		k := pairKey{topic, string(key)}
		p[k] = append(p[k], row)
	}
	return p, rows.Err()
}

// begin opens the transaction, inserts the inbox rows of ids and reads
// what the transaction needs to know of the batch: which ids are new, the
// outcome the inbox remembers for the others, and, when the pipeline is
// ordered, the parked heads and waiting records of the batch's keys. The
// common case — every id new, no key of the batch parked or waiting —
// costs one round trip (BEGIN, the inbox rows, one lookup of the keys) and
// takes no lock. Otherwise a second round trip locks the busy keys (so the
// worker of a key's retry topic and the one of its source topic do not
// interleave on it) and reads their state under the lock, with the
// remembered outcomes of the ids that were not new. A key found idle needs
// no lock: only a transaction that already sees it busy (a head or waiting
// records, both committed before any retry record of the key exists) can
// change its state concurrently.
func (s *scope) begin(ctx context.Context, ids []string, work []*consumer.Record, metas []retrytopic.Metadata, ordered bool) (tx pgx.Tx, fresh map[string]bool, known map[string]inboxStatus, park parking, waiting map[pairKey]bool, err error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	var topics []string
	var keys [][]byte
	if ordered {
		topics, keys = parkedKeys(work, metas)
	}
	b.Queue(s.sqlInbox, s.o.Consumer, ids)
	if len(keys) > 0 {
		b.Queue(s.sqlBusyKeys, s.o.Consumer, topics, keys)
	}
	br := s.o.Pool.SendBatch(ctx, b)
	tx = br.Tx()
	fail := func(err error) (pgx.Tx, map[string]bool, map[string]inboxStatus, parking, map[pairKey]bool, error) {
		br.Close() //nolint:errcheck // err says it
		return tx, nil, nil, nil, nil, err
	}
	if _, err := br.Exec(); err != nil { // BEGIN
		return fail(err)
	}
	rows, err := br.Query()
	if err != nil {
		return fail(err)
	}
	fresh = make(map[string]bool, len(ids))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return fail(err)
		}
		fresh[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	var busyTopics []string
	var busyKeys [][]byte
	if len(keys) > 0 {
		if rows, err = br.Query(); err != nil {
			return fail(err)
		}
		for rows.Next() {
			var topic string
			var key []byte
			if err := rows.Scan(&topic, &key); err != nil {
				rows.Close()
				return fail(err)
			}
			busyTopics, busyKeys = append(busyTopics, topic), append(busyKeys, key)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fail(err)
		}
	}
	if err := br.Close(); err != nil {
		return tx, nil, nil, nil, nil, err
	}
	known = map[string]inboxStatus{}
	park = parking{}
	waiting = map[pairKey]bool{}
	var seenBefore []string
	if len(fresh) < len(ids) {
		for _, id := range ids {
			if !fresh[id] {
				seenBefore = append(seenBefore, id)
			}
		}
	}
	if len(seenBefore) == 0 && len(busyKeys) == 0 {
		return tx, fresh, known, park, waiting, nil
	}
	b = &pgx.Batch{}
	if len(busyKeys) > 0 {
		b.Queue(s.sqlLockKeys, s.o.Consumer, busyTopics, busyKeys)
		b.Queue(s.sqlLoadParked, s.o.Consumer, busyTopics, busyKeys)
		b.Queue(s.sqlLoadWaitingKeys, s.o.Consumer, busyTopics, busyKeys)
	}
	if len(seenBefore) > 0 {
		b.Queue(s.sqlStatus, s.o.Consumer, seenBefore)
	}
	br = tx.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	if len(busyKeys) > 0 {
		if _, err := br.Exec(); err != nil { // the locks
			return tx, nil, nil, nil, nil, err
		}
		rows, err := br.Query()
		if err != nil {
			return tx, nil, nil, nil, nil, err
		}
		if park, err = scanParking(rows); err != nil {
			return tx, nil, nil, nil, nil, err
		}
		if rows, err = br.Query(); err != nil {
			return tx, nil, nil, nil, nil, err
		}
		for rows.Next() {
			var topic string
			var key []byte
			if err := rows.Scan(&topic, &key); err != nil {
				rows.Close()
				return tx, nil, nil, nil, nil, err
			}
			waiting[pairKey{topic, string(key)}] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return tx, nil, nil, nil, nil, err
		}
	}
	if len(seenBefore) > 0 {
		rows, err := br.Query()
		if err != nil {
			return tx, nil, nil, nil, nil, err
		}
		for rows.Next() {
			var id string
			var st inboxStatus
			if err := rows.Scan(&id, &st.status, &st.attempt, &st.stage, &st.via); err != nil {
				rows.Close()
				return tx, nil, nil, nil, nil, err
			}
			known[id] = st
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return tx, nil, nil, nil, nil, err
		}
	}
	return tx, fresh, known, park, waiting, nil
}

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
func (s *scope) runTx(ctx context.Context, work []*consumer.Record, ids []string, fails map[*consumer.Record]*failure, calls map[*consumer.Record]*queuedCall, known map[int]error) (res []result, stop *transientError, err error) {
	ordered := s.ordered()
	vers := s.o.Versions
	metas := make([]retrytopic.Metadata, len(work))
	for i, r := range work {
		metas[i] = s.f.Metadata(r)
	}
	tx, fresh, prior, park, waiting, err := s.begin(ctx, ids, work, metas, ordered)
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	defer func() {
		if err != nil && (tx.Conn() == nil || tx.Conn().IsClosed()) {
			// The connection is gone with the transaction: the queued
			// handlers' statements are not trusted to be what killed it.
			clear(calls)
		}
	}()
	if err != nil {
		return nil, nil, err
	}
	res = make([]result, len(work))
	// isNew[i]: record i's inbox row is new in this transaction; it is
	// deleted again if the record ends without an outcome (retried in
	// place, deferred, not tried), so that its next delivery runs it.
	isNew := make([]bool, len(work))
	seen := make(map[string]bool, len(ids))
	for i, id := range ids {
		r := work[i]
		st, had := prior[id]
		switch {
		case seen[id]:
			// A second copy in the batch of an identity whose earlier copy
			// runs (or is routed again): that one's outcome is its own.
			res[i].out = duplicate
		case fresh[id]:
			res[i].out, isNew[i] = toApply, true
		case had && st.status == statusRetry && metas[i].Stage >= 0 && !metas[i].Parked && metas[i].Attempt == st.attempt:
			res[i].out = toApply // the hop it was sent on: it runs again
		case had && st.status == statusDead && hasHeader(r, retrytopic.HeaderRedrive):
			res[i].out = toApply // redriven from the DLT by an operator
		case had && (st.status == statusRetry || st.status == statusDLT) && st.via == coords(r):
			// The copy that was being routed when the process stopped:
			// its routing may not have reached the broker.
			res[i] = result{out: rerouteOutcome, st: st}
		default:
			res[i].out = duplicate
		}
		// An earlier copy that is a no-op (a stale hop, a crash re-send)
		// says nothing of a later one: the live hop behind it in the same
		// batch still runs.
		if res[i].out == toApply || res[i].out == rerouteOutcome {
			seen[id] = true
		}
	}
	var up statusUpdates
	var undo []string
	// setStatus records record i's outcome in its inbox row.
	setStatus := func(i int, status string, attempt, stage int) {
		if status == statusApplied && isNew[i] {
			return // the new row's default
		}
		up.add(ids[i], status, attempt, stage, coords(work[i]))
	}
	// routed records the outcome of record i that step routes.
	routed := func(i int, step retrytopic.Step, attempt int) {
		total := min(metas[i].Attempt+attempt, retrytopic.MaxAttempt)
		switch step.Action {
		case retrytopic.ActionRetryTopic:
			setStatus(i, statusRetry, total, step.Stage)
		case retrytopic.ActionDeadLetter:
			setStatus(i, statusDLT, total, 0)
		case retrytopic.ActionSkip:
			setStatus(i, statusApplied, 0, 0)
		default:
			if isNew[i] {
				undo = append(undo, ids[i])
			}
		}
	}
	// q holds the statements sent, pipelined, before COMMIT: the queued
	// handlers' and the scope's own closing ones.
	q := newPipeline()
	rtx := &recordTx{tx: tx}
	savepoints := 0
	cut := len(work) // the records from cut on are notTried
	// versions[i] is record i's version when versions are checked.
	var versions []int64
	if vers != nil {
		versions = make([]int64, len(work))
	}
	var blocked map[string]bool
	blockedNull := false
	// unpark deletes a record's head row once it leaves the retry
	// pipeline; the waiting records of its key are then released.
	unpark := func(i int) error {
		if !ordered || work[i].Key == nil {
			return nil
		}
		k := pairKey{metas[i].OriginalTopic, string(work[i].Key)}
		if !park.has(k, ids[i]) {
			return nil
		}
		park.remove(k, ids[i])
		if _, ok := park.head(k); !ok && waiting[k] {
			res[i].release = true
		}
		_, err := tx.Exec(ctx, s.sqlUnpark, s.o.Consumer, k.topic, work[i].Key, ids[i])
		return err
	}
	setPark := func(i, stage int) error {
		k := pairKey{metas[i].OriginalTopic, string(work[i].Key)}
		var v int64
		if versions != nil {
			v = versions[i]
		}
		park.set(k, parkRow{id: ids[i], offset: metas[i].OriginalOffset, stage: stage, version: v})
		_, err := tx.Exec(ctx, s.sqlPark, s.o.Consumer, k.topic, work[i].Key, ids[i], metas[i].OriginalOffset, stage, v)
		return err
	}
	// fail records a failure decided before the handler ran (an unreadable
	// version, a version gap) the way a handler failure is recorded.
	fail := func(i int, herr error, step retrytopic.Step) {
		res[i] = result{out: failedOutcome, err: herr, step: step}
		a := 1
		if fi := fails[work[i]]; fi != nil {
			a = fi.attempts + 1
		}
		routed(i, step, a)
		r := work[i]
		if r.Key == nil {
			blockedNull = true
		} else {
			if blocked == nil {
				blocked = make(map[string]bool)
			}
			blocked[string(r.Key)] = true
		}
	}
	attemptOf := func(r *consumer.Record) int {
		if fi := fails[r]; fi != nil {
			return fi.attempts + 1
		}
		return 1
	}

	for i, r := range work {
		if s.qh == nil && savepoints >= maxSavepoints {
			cut = i
			break
		}
		if res[i].out == duplicate || res[i].out == rerouteOutcome {
			continue
		}
		if (r.Key == nil && blockedNull) || (r.Key != nil && blocked[string(r.Key)]) {
			res[i].out = deferred
			if isNew[i] {
				undo = append(undo, ids[i])
			}
			continue
		}
		if vers != nil && r.Key != nil {
			v, err := vers.Version(r)
			if err != nil {
				herr := consumer.DecodeError(err) // poison: the DLT, with the reason
				fail(i, herr, s.f.Decide(ctx, r, herr, attemptOf(r), false))
				continue
			}
			versions[i] = v
		}
		if ordered && r.Key != nil {
			// A key with a record in the retry topics (its head), or with
			// records waiting in PostgreSQL: unless this is the head, or a
			// version that fills the gap the head waits for, it is stored
			// in PostgreSQL and waits behind them.
			k := pairKey{metas[i].OriginalTopic, string(r.Key)}
			h, ok := park.head(k)
			if (ok && h.id != ids[i] && !(versions != nil && h.version > 0 && versions[i] < h.version)) || (!ok && waiting[k]) {
				var v int64
				if versions != nil {
					v = versions[i]
				}
				q.Exec(s.sqlWait, s.waitArgs(k.topic, r, ids[i], v)...)
				if park.has(k, ids[i]) {
					// In the retry topics behind a head (parked before the
					// waiting table): it waits in PostgreSQL now.
					park.remove(k, ids[i])
					if _, err := tx.Exec(ctx, s.sqlUnpark, s.o.Consumer, k.topic, r.Key, ids[i]); err != nil {
						return nil, nil, err
					}
				}
				waiting[k] = true
				setStatus(i, statusParked, 0, 0)
				res[i] = result{out: parkedOutcome}
				continue
			}
		}
		hctx := s.f.Observer().Context(ctx, r)
		if vers != nil && r.Key != nil {
			check, err := s.checkVersion(ctx, tx, metas[i].OriginalTopic, r.Key, versions[i])
			if err != nil {
				return nil, nil, err
			}
			switch {
			case check.Outcome == sequence.Stale:
				res[i].out = staleOutcome
				setStatus(i, statusApplied, 0, 0)
				if err := unpark(i); err != nil {
					return nil, nil, err
				}
				continue
			case check.Outcome == sequence.Gap && vers.Gaps != sequence.Accept:
				gap := &retrytopic.VersionGapError{Expected: check.Expected(), Actual: versions[i]}
				timedOut := !metas[i].FirstFailure.IsZero() && time.Since(metas[i].FirstFailure) > vers.GapTimeout
				pol := s.f.Policy()
				if vers.Gaps == sequence.DeadLetter || timedOut || pol.DisableRetryTopics || len(pol.Ladder) == 0 {
					herr := consumer.Terminal(gap)
					fail(i, herr, s.f.Decide(ctx, r, herr, attemptOf(r), false))
					res[i].gap, res[i].gapDetail = gapDead, gap.Error()
					if timedOut {
						res[i].gap = gapTimedOut
					}
					continue // its head row goes once the DLT has it
				}
				// Wait: to the next retry topic, the key parked behind this
				// record; the missing versions still pass.
				stage := min(metas[i].Stage+1, len(pol.Ladder)-1)
				step := retrytopic.Step{Action: retrytopic.ActionRetryTopic, Class: consumer.ClassRetryable,
					Delay: pol.Ladder[stage], Stage: stage, Topic: retrytopic.RetryTopic(s.group, pol.Ladder[stage])}
				fail(i, consumer.Retryable(gap), step)
				res[i].gap, res[i].gapDetail = gapWaiting, gap.Error()
				if metas[i].ExpectedVersion == 0 {
					res[i].gap = gapDetected
				}
				if ordered && r.Key != nil {
					if err := setPark(i, stage); err != nil {
						return nil, nil, err
					}
				}
				continue
			case check.Outcome == sequence.Gap:
				res[i].gap = gapAccepted
			case metas[i].ExpectedVersion > 0:
				res[i].gap = gapHealed
			}
			hctx = sequence.WithResult(hctx, check)
		}
		// saveVersion advances the key's version with the record's effects.
		saveVersion := func(q interface {
			Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
		}) error {
			if vers == nil || r.Key == nil {
				return nil
			}
			_, err := q.Exec(ctx, s.sqlSaveVersion, s.o.Consumer, metas[i].OriginalTopic, r.Key, versions[i])
			return err
		}
		// succeed records the record's success, or its business skip
		// (herr): its version advances and it leaves the parking.
		succeed := func(i int, herr error) error {
			res[i].out = applied
			if herr != nil {
				res[i].out = skipped
			}
			if err := saveVersion(tx); err != nil {
				return err
			}
			setStatus(i, statusApplied, 0, 0)
			return unpark(i)
		}
		var herr error
		if s.qh != nil {
			c := calls[r]
			switch {
			case known[i] != nil:
				herr = known[i] // a statement of its failed in an earlier try
			case c == nil:
				c = &queuedCall{}
				c.err = s.queue(hctx, &c.q, r)
				calls[r] = c
				herr = c.err
			default:
				herr = c.err
			}
			if herr != nil && known[i] == nil && s.transient(herr) {
				cut, stop = i, &transientError{rec: r, err: herr}
				break
			}
			if herr == nil || (known[i] == nil && s.f.Class(herr) == consumer.ClassSkip) {
				// Success, or a business skip: what it queued is sent.
				q.add(i, &c.q)
				if err := succeed(i, herr); err != nil {
					return nil, nil, err
				}
				continue
			}
		} else {
			rtx.reset(hctx)
			herr = s.call(hctx, rtx, r)
			if rtx.sp {
				savepoints++
			}
			conn := tx.Conn()
			if conn.IsClosed() {
				if herr == nil {
					herr = errConnLost
				}
				return nil, nil, &transientError{rec: r, err: herr}
			}
			if herr == nil {
				herr = rtx.err // it could not write: it did not apply
			}
			aborted := conn.PgConn().TxStatus() == 'E'
			ok := !aborted && (herr == nil || s.f.Class(herr) == consumer.ClassSkip)
			if !ok && rtx.sp {
				if err := rtx.rollback(ctx); err != nil {
					return nil, nil, err
				}
			} else if aborted {
				return nil, nil, fmt.Errorf("dbscope: the transaction was aborted before the record's savepoint: %w", errors.Join(herr, rtx.err))
			}
			if herr != nil && s.transient(herr) {
				cut, stop = i, &transientError{rec: r, err: herr}
				break
			}
			switch {
			case aborted && herr == nil:
				herr = errAborted
			case aborted && s.f.Class(herr) == consumer.ClassSkip:
				// A business skip stays one, without its writes.
				res[i].err = fmt.Errorf("%w; %s", herr, lostWrites)
				ok = true
			}
			if ok {
				if err := succeed(i, herr); err != nil {
					return nil, nil, err
				}
				continue
			}
		}
		attempt := 1
		if fi := fails[r]; fi != nil {
			attempt = fi.attempts + 1
		}
		// Null-key records keep their partition order by retrying in
		// place, unless the pipeline is unordered.
		pol := s.f.Policy()
		topics := !pol.DisableRetryTopics && (r.Key != nil || pol.Unordered)
		step := s.f.Decide(ctx, r, herr, attempt, topics)
		res[i] = result{out: failedOutcome, err: herr, step: step}
		routed(i, step, attempt)
		switch {
		case step.Action == retrytopic.ActionRetryTopic && ordered && r.Key != nil:
			if err := setPark(i, step.Stage); err != nil { // it is, or stays, its key's head
				return nil, nil, err
			}
		case step.Action == retrytopic.ActionSkip:
			if err := unpark(i); err != nil {
				return nil, nil, err
			}
		}
		if r.Key == nil {
			blockedNull = true
		} else {
			if blocked == nil {
				blocked = make(map[string]bool)
			}
			blocked[string(r.Key)] = true
		}
	}
	for j := cut; j < len(work); j++ {
		if res[j].out == toApply && isNew[j] {
			undo = append(undo, ids[j]) // its inbox row goes until it is tried
		}
		res[j] = result{out: notTried}
	}
	if len(undo) > 0 {
		q.Exec(s.sqlForget, s.o.Consumer, undo)
	}
	if len(up.ids) > 0 {
		q.Exec(s.sqlSetStatus, s.o.Consumer, up.ids, up.statuses, up.attempts, up.stages, up.vias)
	}
	if s.o.StoreOffsets {
		k := 0
		for k < len(work) && (res[k].out == applied || res[k].out == skipped || res[k].out == duplicate || res[k].out == staleOutcome || res[k].out == parkedOutcome) {
			k++
		}
		if k > 0 {
			r := work[k-1]
			q.Exec(s.sqlOffset, s.o.Consumer, r.Topic, r.Partition, r.Shard(), s.shards, r.Offset+1, s.routing)
		}
	}
	if err := q.send(ctx, tx); err != nil {
		var se *stmtError
		if errors.As(err, &se) && se.owner >= 0 {
			if IsTransient(se.err) || tx.Conn().IsClosed() {
				return nil, nil, &transientError{rec: work[se.owner], err: se.err}
			}
			// A queued statement of record se.owner failed: the batch
			// runs again without that record's statements.
			return nil, nil, &isolateError{i: se.owner, err: se.err}
		}
		return nil, nil, unwrapStmt(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, err
	}
	return res, stop, nil
}

// transient reports whether a handler's error is a transient database
// error, which retries the transaction rather than failing the record: an
// error the handler (or Policy.Classify) gave a class follows the failure
// policy whatever it wraps.
func (s *scope) transient(err error) bool {
	return s.f.Class(err) == consumer.ClassUnknown && IsTransient(err)
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

// checkVersion reads, with a row lock, the last applied version of key and
// checks v against it.
func (s *scope) checkVersion(ctx context.Context, tx pgx.Tx, topic string, key []byte, v int64) (sequence.Result, error) {
	var last int64
	err := tx.QueryRow(ctx, s.sqlLoadVersion, s.o.Consumer, topic, key).Scan(&last)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return s.o.Versions.Check(v, 0, false), nil
	case err != nil:
		return sequence.Result{}, err
	}
	return s.o.Versions.Check(v, last, true), nil
}
