package dbscope

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/scope"
	"github.com/kscope-dev/kscope/sequence"
)

const (
	retryBase = 100 * time.Millisecond
	retryCap  = 30 * time.Second
)

// Runner is a consumer.Runner in the DB scope.
type Runner struct {
	*consumer.Runner
	s *dbScope
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
// with a class follows the failure policy, whatever it wraps.
//
// An error that says the deployment is wrong rather than the record
// ([IsDeploymentError]: SQLSTATE class 42, such as 42P01 undefined table,
// 42703 undefined column, 42501 insufficient privilege; class 28; 3D000;
// class 3F), unless the handler marked it with a class or
// Policy.Classify classifies it, is nobody's record's fault: the
// key-shard that meets it holds (its record and those behind it), routes
// nothing to the retry topics or the dead-letter topic, commits the
// records before it, and retries with a backoff that grows to 30 s. It
// goes on by itself once the statement succeeds (the migration ran, the
// privilege was granted), applying every record once, in order. The
// runner logs one ERROR when the first key-shard starts holding and one
// INFO when the last goes on, and reports the hold in Stats().Hold and to
// hook.HoldHook (kscope_held_key_shards in kscopeprom). The offset
// is never committed past a record whose transaction did not commit or
// whose dead-letter produce was not acknowledged.
//
// Run [Migrate] first: Run fails at start with a [*SchemaError] when
// kscope's tables are missing or older than this version, and with a
// [*DatabaseError] when the database refuses the runner or does not
// answer within Options.StartTimeout. What the DB scope does not cover:
// anything the handler does outside tx.
func New(cfg consumer.Config, o Options, h Handler) (*Runner, error) {
	if h == nil {
		return nil, &consumer.ConfigError{Struct: "dbscope.New's handler", Reason: "is nil; pass the function that applies each record in its transaction"}
	}
	return newRunner(cfg, o, h, nil, nil)
}

// newRunner builds a DB-scope runner around a Handler, a QueueHandler or
// a BatchHandler.
func newRunner(cfg consumer.Config, o Options, h Handler, qh QueueHandler, bh BatchHandler) (*Runner, error) {
	// A share group keeps retries in place (consumer.ShareConfig): its
	// defaults say so.
	s := &dbScope{h: h, qh: qh, bh: bh, o: o.withDefaults(cfg), useTopics: !cfg.WithDefaults().Failures.DisableRetryTopics, defaultConsumer: o.Consumer == "",
		holdKeys: cfg.KeyBreaker != nil}
	o = s.o
	oerr := o.validate()
	if o.Versions != nil && cfg.Failures.Unordered {
		oerr = errors.Join(oerr, &consumer.ConfigError{Struct: "dbscope.Options", Field: "Versions",
			Reason: "is set with Config.Failures.Unordered; versions are applied in per-key order, so unset one of them"})
	}
	r, err := consumer.NewScoped(cfg, s)
	if err = errors.Join(err, oerr, checkShare(cfg, o), consumer.CheckRoutes(cfg, h), consumer.CheckRoutes(cfg, qh)); err != nil {
		return nil, err
	}
	s.init(r.Config())
	return &Runner{Runner: r, s: s}, nil
}

type dbScope struct {
	h      Handler
	qh     QueueHandler // instead of h: the handler queues its statements
	bh     BatchHandler // instead of h: the handler takes a transaction's records together
	o      Options
	log    *slog.Logger
	shards int
	// routing names how records are routed to key-shards (see routingOf):
	// stored positions are used only under the routing they were written
	// under.
	routing string

	sqlInbox, sqlForget, sqlOffset, sqlLoadOffsets string
	inbox                                          inboxInsert
	sqlLoadParked, sqlPark, sqlUnpark              string
	sqlLoadVersion, sqlSaveVersion                 string
	sqlLockKeys, sqlStatus, sqlOneStatus           string
	sqlSetStatus, sqlCountHeads, sqlWait           string
	sqlLoadWaitingKeys, sqlLoadWaitingRows         string
	sqlBusyKeys                                    string
	sqlWaitingHead, sqlDeleteWaiting               string
	sqlLoadWaitingHeads, sqlOrphanKeys             string
	sqlHasParking, sqlWaitingHeadExists            string
	sqlHold, sqlWaitFirst, sqlTakeProbe            string
	sqlDueHeld, sqlCountHeld                       string

	marksMu sync.Mutex
	marks   map[shardKey]int64 // next offset not known durable, per partition and shard

	applied, duplicates, replaySkipped atomic.Int64
	failed, txRetries, transactions    atomic.Int64
	skipped, parked                    atomic.Int64
	stale, gapsDetected, gapsHealed    atomic.Int64
	gapsAccepted, gapsTimedOut         atomic.Int64
	versionsSkipped, gapsFilled        atomic.Int64 // the versions gaps were applied over (Accept, TimeoutAccept)
	waiting                            startWait    // what Start waits for (Stats.Waiting)
	group                              string

	eng       scope.Engine[*consumer.Record]
	f         scope.Failures[*consumer.Record]
	obs       scope.Observer[*consumer.Record]
	identity  consumer.Identity
	useTopics bool

	// defaultConsumer says that Options.Consumer was left to default to
	// the group id (see checkConsumerName); topics, brokers and
	// clientOpts are the Config's, for that check's lookups.
	defaultConsumer bool
	topics, brokers []string
	clientOpts      []kgo.Opt

	parkRows parkWatch  // whether the consumer may have parked or waiting rows (see honours)
	inRoute  routeMarks // the waiting records this process's releases are routing now

	// holdKeys: consumer.Config.KeyBreaker is set, and the scope holds
	// keys in PostgreSQL (keyhold.go); heldKeys is how many the last
	// recovery pass found held.
	holdKeys bool
	heldKeys atomic.Int64
}

// UseEngine implements scope.EngineUser.
func (s *dbScope) UseEngine(e scope.Engine[*consumer.Record]) {
	s.eng, s.f, s.obs = e, e.Failures(), e.Observer()
}

// UsesRetryTopics implements scope.RetryTopicUser.
func (s *dbScope) UsesRetryTopics() bool { return s.useTopics }

type shardKey struct {
	topic     string
	partition int32
	shard     int
}

func (s *dbScope) init(cfg consumer.Config) {
	o := s.o
	s.identity = cfg.Identity
	s.group = cfg.Group
	s.topics, s.brokers, s.clientOpts = cfg.Topics, cfg.Brokers, cfg.ClientOptions
	s.log = cfg.Logger.With("group", cfg.Group, "scope", "db")
	s.shards = cfg.Shards
	s.marks = make(map[shardKey]int64)
	p := o.TablePrefix
	// One row: whether every id got a new row (the usual case) and, only
	// when not, the ids that did, so that a batch of new records is not
	// read back id by id.
	s.sqlInbox = `WITH ins AS (INSERT INTO ` + p + `inbox (consumer, message_id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING RETURNING message_id)
		SELECT count(*) = cardinality($2::text[]), CASE WHEN count(*) = cardinality($2::text[]) THEN NULL ELSE array_agg(message_id) END FROM ins`
	s.inbox.sqlNew = `INSERT INTO ` + p + `inbox (consumer, message_id) SELECT $1, unnest($2::text[])`
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
		ON CONFLICT (consumer, topic, key, message_id) DO UPDATE SET stage = EXCLUDED.stage, held = false, probe_at = NULL, probes = 0`
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
	// A row's age (processed_at, which the inbox TTL counts from) starts
	// again when its record reaches an outcome: a record that spent hours
	// in the retry topics is still recognised for the TTL after that.
	s.sqlSetStatus = `UPDATE ` + p + `inbox AS i SET status = u.status, attempt = u.attempt, stage = u.stage, via = u.via,
			processed_at = CASE WHEN u.status IN ('applied', 'dead') AND u.status IS DISTINCT FROM i.status THEN now() ELSE i.processed_at END
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
	const waitingCols = `id, message_id, key, src_topic, src_partition, src_offset, ts, value, header_keys, header_values, version, head, parked_at`
	s.sqlLoadWaitingRows = `SELECT ` + waitingCols + ` FROM ` + p + `waiting
		WHERE consumer = $1 AND topic = $2 AND key = $3 ORDER BY version NULLS FIRST, id LIMIT $4 FOR UPDATE`
	s.sqlWaitingHead = `UPDATE ` + p + `waiting SET head = true WHERE id = $1`
	s.sqlDeleteWaiting = `DELETE FROM ` + p + `waiting WHERE id = ANY($1::bigint[])`
	s.sqlLoadWaitingHeads = `SELECT topic, ` + waitingCols + ` FROM ` + p + `waiting WHERE consumer = $1 AND head ORDER BY id`
	s.sqlOrphanKeys = `SELECT DISTINCT w.topic, w.key FROM ` + p + `waiting AS w WHERE w.consumer = $1 AND NOT w.head
		AND NOT EXISTS (SELECT 1 FROM ` + p + `parked AS k WHERE k.consumer = w.consumer AND k.topic = w.topic AND k.key = w.key)`
	s.sqlHasParking = `SELECT EXISTS (SELECT 1 FROM ` + p + `parked WHERE consumer = $1) OR EXISTS (SELECT 1 FROM ` + p + `waiting WHERE consumer = $1)`
	s.sqlWaitingHeadExists = `SELECT EXISTS (SELECT 1 FROM ` + p + `waiting WHERE id = $1 AND head)`
	s.initHoldSQL(p)
}

// Start implements scope.Starter: Run fails at once with a
// [*SchemaError], which says to run [Migrate], when the database lacks
// kscope's tables or a migration of this version, and with a
// [*DatabaseError] when PostgreSQL refuses the runner (see
// IsDeploymentError). Any other error (the database not reachable yet) is
// retried with backoff for up to Options.StartTimeout, then fails Run with
// a *DatabaseError (see checkTables).
// Then, for a consumer with no row in the tables of its prefix, it fails
// with a *consumer.ConfigError when the data shows that a deployment
// before it ran under another TablePrefix and left records parked or
// waiting there (see checkTablePrefix), or, with Options.Consumer left to
// default to the group id, under another group id whose records it would
// apply again (see checkConsumerName).
func (s *dbScope) Start(ctx context.Context) error {
	if err := s.checkTables(ctx); err != nil {
		return err
	}
	known, err := s.consumerKnown(ctx)
	if err != nil || known {
		if err != nil && ctx.Err() == nil {
			s.log.Warn("kscope: could not check whether kscope's tables hold this consumer's rows; starting anyway", "err", err)
		}
		return nil
	}
	for _, check := range []struct {
		what string
		run  func(context.Context) (*consumer.ConfigError, error)
	}{
		{"the tables of another table prefix hold this consumer's rows", s.checkTablePrefix},
		{"the inbox holds the records of a group this one was renamed from", s.checkConsumerName},
	} {
		ce, err := check.run(ctx)
		switch {
		case ce != nil:
			return ce
		case err != nil && ctx.Err() == nil:
			s.log.Warn("kscope: could not check whether "+check.what+"; starting anyway", "err", err)
		}
	}
	return nil
}

// BatchLimits implements scope.Batcher.
func (s *dbScope) BatchLimits() (int, time.Duration) { return s.o.BatchSize, s.o.BatchLinger }

// ClientOptions implements scope.ClientOptioner: with StoreOffsets, the
// positions stored in the database are loaded on every assignment.
func (s *dbScope) ClientOptions() []kgo.Opt {
	if !s.o.StoreOffsets {
		return nil
	}
	return []kgo.Opt{kgo.AdjustFetchOffsetsFn(s.adjustOffsets)}
}

// RunBackground implements scope.Background: inbox retention and the
// recovery of parked records (see recoverParking), at start and every
// releaseInterval, whatever the failure policy: rows an ordered
// deployment left are finished by one that is not.
func (s *dbScope) RunBackground(ctx context.Context) {
	var cleanup <-chan time.Time
	if s.o.InboxTTL > 0 {
		t := time.NewTicker(s.o.CleanupInterval)
		defer t.Stop()
		cleanup = t.C
	}
	rec := &recovery{}
	s.recoverParking(ctx, rec)
	release := time.NewTicker(releaseInterval)
	defer release.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-release.C:
			s.recoverParking(ctx, rec)
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
	heldOutcome    // its failure held its key (consumer.Config.KeyBreaker): stored as the key's held head
)

// durable reports whether a record with this outcome is done once its
// transaction commits: a stored position may pass it.
func (o outcome) durable() bool {
	switch o {
	case applied, skipped, duplicate, staleOutcome, parkedOutcome, heldOutcome:
		return true
	}
	return false
}

// gapNote says what a record's transaction did about a version gap.
type gapNote uint8

const (
	noGap       gapNote = iota
	gapDetected         // first found: the record waits in the retry topics
	gapWaiting          // still waiting
	gapHealed           // the missing versions came: applied
	gapAccepted         // applied over the gap (sequence.Accept)
	gapFilled           // Options.FillGap rebuilt the missing state: applied
	gapTimedOut         // waited past GapTimeout: to the DLT
	gapDead             // sequence.DeadLetter: to the DLT at once
)

// isolateError says that a statement of record i failed and aborted the
// transaction before the record's savepoint could undo it (a queued
// statement, or a Handler's first statement that PostgreSQL could not
// prepare): the transaction is run again without record i's statements,
// record i taking err as its failure (its handler is not called again).
type isolateError struct {
	i   int
	err error
}

func (e *isolateError) Error() string {
	return "dbscope: a record's statement failed and aborted the transaction; rerun the batch without its record: " + e.err.Error()
}

// abortedByStatement reports whether err, which aborted a transaction,
// is PostgreSQL refusing a statement (a *pgconn.PgError that is not
// transient): the record that sent it is at fault, not the transaction.
func abortedByStatement(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && !IsTransient(pg)
}

// deferredRefusal reports whether err, raised by COMMIT or by SET
// CONSTRAINTS ALL IMMEDIATE, is a deferred check refusing the
// transaction's writes: a deferred constraint (an integrity violation,
// SQLSTATE class 23) or a deferred constraint trigger raising its own
// error (RAISE EXCEPTION, P0001), judged as a failing statement is
// (abortedByStatement). The record whose writes broke it is at fault.
func deferredRefusal(err error) bool { return abortedByStatement(err) }

// commitViolation is a deferred check that failed at COMMIT
// (deferredRefusal): broken by the writes of one of the records in wrote,
// the indexes of those whose writes the transaction held.
type commitViolation struct {
	err   error
	wrote []int
	ids   []string // a release's: the identities of the records in wrote
}

func (e *commitViolation) Error() string {
	return "dbscope: a deferred constraint failed at commit: " + e.err.Error()
}
func (e *commitViolation) Unwrap() error { return e.err }

// transientError is a transient error raised by a queued statement of
// record rec, or a connection lost under its handler: the transaction is
// rolled back and retried, and the records before rec, which succeeded in
// it, are retried on their own first.
type transientError struct {
	rec *consumer.Record
	err error
}

func (e *transientError) Error() string {
	return fmt.Sprintf("the record at %s/%d offset %d failed transiently: %v", e.rec.Topic, e.rec.Partition, e.rec.Offset, e.err)
}
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

// transient reports whether a handler's error is a transient database
// error, which retries the transaction rather than failing the record: an
// error the handler (or Policy.Classify) gave a class follows the failure
// policy whatever it wraps.
func (s *dbScope) transient(err error) bool {
	return s.f.Class(err) == consumer.ClassUnknown && IsTransient(err)
}

// deployment reports whether err, raised by a statement, says the
// deployment is wrong rather than the record (IsDeploymentError) and
// neither the handler (a class mark) nor Policy.Classify classified it:
// the transaction is retried with backoff and the key-shard holds
// (scope.Round.Held), instead of the record being routed by the failure
// policy. A Classify that returns ok for it, whatever the class (unknown
// included), makes it the record's failure again.
func (s *dbScope) deployment(err error) bool {
	if !IsDeploymentError(err) {
		return false
	}
	if classify := s.f.Policy().Classify; classify != nil {
		if _, ok := classify(err); ok {
			return false
		}
	}
	return retrytopic.ClassOf(err) == consumer.ClassUnknown
}

// call runs the handler through the engine (scope.Engine.Call): the
// admission rules, the handler timeout, the panic guard, the stall watch.
func (s *dbScope) call(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
	if s.bh != nil {
		return s.callOne(ctx, tx, r)
	}
	if s.o.FillGap != nil {
		if gap, ok := sequence.FromContext(ctx); ok && gap.Outcome == sequence.Gap {
			return s.eng.Call(ctx, r, func(ctx context.Context) error {
				if err := s.o.FillGap(ctx, tx, r, gap); err != nil {
					return fmt.Errorf("dbscope: Options.FillGap, for versions %d to %d: %w", gap.Expected(), gap.Version-1, err)
				}
				return s.h.Handle(ctx, tx, r)
			})
		}
	}
	return s.eng.Call(ctx, r, func(ctx context.Context) error { return s.h.Handle(ctx, tx, r) })
}

// gapRoute decides where record r goes, whose version is ahead of its
// key's next one under the Wait or DeadLetter policy (m is its metadata,
// attempt the attempt it is on): to the DLT when the policy says so, when
// it waited past GapTimeout since its first failure, or when the pipeline
// has no retry topics; else to the next retry topic, whatever the retry
// budget: a gap waits for its missing versions, not for attempts of a
// handler. The same decision holds for a record consumed and for one
// released from the waiting table. note says what is counted.
func (s *dbScope) gapRoute(ctx context.Context, r *consumer.Record, m retrytopic.Metadata, gap *retrytopic.VersionGapError, attempt int) (step retrytopic.Step, note gapNote, herr error) {
	timedOut := !m.FirstFailure.IsZero() && time.Since(m.FirstFailure) > s.o.Versions.GapTimeout
	pol := s.f.Policy()
	if s.o.Versions.Gaps == sequence.DeadLetter || timedOut || pol.DisableRetryTopics || len(pol.Ladder) == 0 {
		herr = consumer.Terminal(gap)
		note = gapDead
		if timedOut {
			note = gapTimedOut
		}
		return s.f.Decide(ctx, r, herr, attempt, false), note, herr
	}
	stage := min(m.Stage+1, len(pol.Ladder)-1)
	step = retrytopic.Step{Action: retrytopic.ActionRetryTopic, Class: consumer.ClassRetryable,
		Delay: pol.Ladder[stage], Stage: stage, Topic: retrytopic.RetryTopic(s.group, pol.Ladder[stage])}
	note = gapWaiting
	if m.ExpectedVersion == 0 {
		note = gapDetected
	}
	return step, note, consumer.Retryable(gap)
}

// countGap counts what a record's transaction did about a version gap.
func (s *dbScope) countGap(note gapNote) {
	switch note {
	case gapDetected:
		s.gapsDetected.Add(1)
	case gapHealed:
		s.gapsHealed.Add(1)
	case gapAccepted:
		s.gapsDetected.Add(1)
		s.gapsAccepted.Add(1)
	case gapTimedOut:
		s.gapsTimedOut.Add(1)
	case gapFilled:
		s.gapsDetected.Add(1)
		s.gapsFilled.Add(1)
	case gapDead:
		s.gapsDetected.Add(1)
	}
}

// checkVersion reads, with a row lock, the last applied version of key and
// checks v against it.
func (s *dbScope) checkVersion(ctx context.Context, tx pgx.Tx, topic string, key []byte, v int64) (sequence.Result, error) {
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

// round is what one round of the DB scope's work did, on the runner's
// retry loop (scope.Failures.Rounds).
type round = scope.Round[*consumer.Record]

// The contract's interfaces the DB scope implements: a changed signature is
// a compile error here, not a scope the runner silently runs without them.
var (
	_ scope.Scope[*consumer.Record]       = (*dbScope)(nil)
	_ scope.EngineUser[*consumer.Record]  = (*dbScope)(nil)
	_ scope.RetryTopicUser                = (*dbScope)(nil)
	_ scope.Batcher                       = (*dbScope)(nil)
	_ scope.Starter                       = (*dbScope)(nil)
	_ scope.ClientOptioner                = (*dbScope)(nil)
	_ scope.Background                    = (*dbScope)(nil)
	_ scope.StatsReporter[consumer.Stats] = (*dbScope)(nil)
	_ scope.KeyHolder                     = (*dbScope)(nil)
)
