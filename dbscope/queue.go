package dbscope

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
)

// QueueHandler is the pipelined form of [Handler], for effects that are
// statements needing no result: an INSERT of a ledger row, an UPDATE of a
// balance. Instead of running its statements, the handler queues them on q;
// the DB scope sends the statements of every record of a batch to
// PostgreSQL in one round trip (pgx's pipelining, [pgx.Batch]) inside the
// batch's transaction, with the inbox rows, and commits them together. A
// handler that runs one statement per record through a [Handler] pays one
// round trip per statement instead; with a QueueHandler a batch of 64
// records costs four round trips in all (BEGIN; the inbox rows; the queued
// statements; COMMIT).
//
// A nil error means the queued statements may run. A queued statement
// that would end the transaction (as for a [Handler]) fails the record as
// terminal, and none of its statements is sent. A statement that fails
// fails its record exactly as a [Handler] error would: the transaction is
// run again without that record's statements (the statements the other
// records queued are sent again; their handlers are not called again), it
// goes to the failure policy with the statement's error, and the others
// commit. Statements that break a deferred constraint, refused only at
// COMMIT, fail their record the same way. A handler that needs to read (a
// SELECT, a RETURNING value, a row lock) before it writes is a [Handler].
//
// The handler is called once per delivery of a record; the statements it
// queued are kept while the batch is worked on and sent again when its
// transaction is retried. It is called again only when the record failed
// (the handler returned an error other than a skip, panicked, or one of
// its statements failed) and the failure policy retries it, or when the
// connection was lost or the process stopped (or lost the partition)
// before the transaction committed. Only the statements of a transaction
// that commits take effect. It must not keep q after it returns.
type QueueHandler interface {
	Queue(ctx context.Context, q *Queue, r *consumer.Record) error
}

// QueueFunc adapts a function to [QueueHandler].
type QueueFunc func(ctx context.Context, q *Queue, r *consumer.Record) error

// Queue calls f(ctx, q, r).
func (f QueueFunc) Queue(ctx context.Context, q *Queue, r *consumer.Record) error {
	return f(ctx, q, r)
}

// Queue collects the statements of the record a [QueueHandler] is called
// for. They run in the record's transaction, in the order queued, after the
// handler returns.
type Queue struct {
	stmts []queuedStmt
}

// queuedStmt is a statement and its arguments.
type queuedStmt struct {
	sql  string
	args []any
}

// Exec queues a statement and its arguments, as [pgx.Tx.Exec] would run
// them. The arguments are encoded when the batch is sent: slices of the
// record (its Key, its Value) may be passed as they are.
func (q *Queue) Exec(sql string, args ...any) {
	q.stmts = append(q.stmts, queuedStmt{sql, args})
}

// Len returns how many statements the handler has queued for its record.
func (q *Queue) Len() int { return len(q.stmts) }

// pipeline is what a transaction sends in one round trip before its
// COMMIT: the statements queued by the records' handlers, each with the
// index of its record, and the scope's own closing statements.
type pipeline struct {
	b      *pgx.Batch
	owners []int // owners[j] is the index of the record that queued statement j; -1 for the scope's own
}

// newPipeline returns an empty pipeline with room for n statements.
func newPipeline(n int) *pipeline {
	return &pipeline{b: &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, n)}, owners: make([]int, 0, n)}
}

// Exec queues one of the scope's own statements.
func (p *pipeline) Exec(sql string, args ...any) {
	p.b.Queue(sql, args...)
	p.owners = append(p.owners, -1)
}

// add queues the statements record i's handler queued.
func (p *pipeline) add(i int, q *Queue) {
	for _, st := range q.stmts {
		p.b.Queue(st.sql, st.args...)
		p.owners = append(p.owners, i)
	}
}

// NewQueued returns a runner in the DB scope whose handler queues its
// statements (see [QueueHandler]) instead of running them one round trip
// at a time. Everything [New] says holds: one inbox row per record in the
// same transaction as its statements, the offset committed only after that
// transaction, a failing record rolled back alone and routed by the
// failure policy.
func NewQueued(cfg consumer.Config, o Options, h QueueHandler) (*Runner, error) {
	if h == nil {
		return nil, &consumer.ConfigError{Struct: "dbscope.NewQueued's handler", Reason: "is nil; pass the function that queues each record's statements"}
	}
	return newRunner(cfg, o, nil, h, nil)
}

// queuedCall is what a QueueHandler's call for a record returned. It is
// kept while the record's batch is worked on, so that the handler is not
// called again when the transaction is retried after another record
// failed, or after a transient error that did not cost the connection.
type queuedCall struct {
	q   Queue
	err error
}

// queue runs the queued handler for r, its statements going to q. It turns
// a panic into an error.
func (s *dbScope) queue(ctx context.Context, q *Queue, r *consumer.Record) error {
	err := s.eng.Call(ctx, r, func(ctx context.Context) error { return s.qh.Queue(ctx, q, r) })
	if err != nil && s.f.Class(err) != consumer.ClassSkip {
		return err
	}
	for _, st := range q.stmts {
		if cmd := endsTx(st.sql); cmd != "" {
			// Its statements would end the batch's transaction: none of
			// them is sent, and the record fails.
			q.stmts = nil
			return errEndsTx(cmd)
		}
	}
	return err
}

// stmtError is a queued statement that failed, with the record it belongs
// to (-1: one of the scope's own statements).
type stmtError struct {
	owner int
	err   error
}

func (e *stmtError) Error() string { return e.err.Error() }
func (e *stmtError) Unwrap() error { return e.err }

// send runs the statements of p in tx, pipelined. A failing statement is
// reported as a *stmtError naming its record.
func (p *pipeline) send(ctx context.Context, tx pgx.Tx) error {
	if p.b.Len() == 0 {
		return nil
	}
	br := tx.SendBatch(ctx, p.b)
	var failed error
	for j := range p.b.Len() {
		if _, err := br.Exec(); err != nil {
			failed = &stmtError{owner: p.ownerOf(j, err), err: err}
			break
		}
	}
	cerr := br.Close()
	if failed != nil {
		return failed
	}
	return cerr
}

// ownerOf returns the index of the record whose statement err, read as
// the result of statement j, is about. pgx prepares the statements new to
// the connection, and encodes the arguments of all, before it runs any:
// an error in that step is every statement's result, and it names the
// statement by its SQL. A statement PostgreSQL cannot prepare fails
// wherever it is queued, so it is the first record that queued it that
// fails. An argument pgx cannot encode is also reported for the first
// record that queued the same SQL; encodingCulprit finds the record whose
// arguments fail.
func (p *pipeline) ownerOf(j int, err error) int {
	var pe pgx.ErrPreprocessingBatch
	if !errors.As(err, &pe) {
		return p.owners[j]
	}
	for k, q := range p.b.QueuedQueries {
		if q.SQL == pe.SQL() {
			return p.owners[k]
		}
	}
	return -1
}

// encodingFailure reports whether err, a statement's result, is pgx
// failing to encode the arguments of a queued statement (not PostgreSQL
// refusing it, nor a lost connection), and returns that statement's SQL.
// pgx names no more than the SQL, and closes the connection.
func encodingFailure(err error) (string, bool) {
	var pe pgx.ErrPreprocessingBatch
	var pg *pgconn.PgError
	if !errors.As(err, &pe) || errors.As(err, &pg) || IsTransient(pe.Unwrap()) {
		return "", false
	}
	return pe.SQL(), true
}

// encodingCulprit returns the record whose statement with the given SQL
// has the first arguments pgx cannot encode: it encodes each such
// statement's arguments again, as pgx does, against the statement's
// parameter types, described on a connection of pool. It returns -1 when
// none fails, or when the statement cannot be described.
func (p *pipeline) encodingCulprit(ctx context.Context, pool *pgxpool.Pool, sql string) int {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return -1
	}
	defer conn.Release()
	sd, err := conn.Conn().PgConn().Prepare(ctx, "", sql, nil)
	if err != nil {
		return -1
	}
	m := conn.Conn().TypeMap()
	for j, q := range p.b.QueuedQueries {
		if q.SQL != sql {
			continue
		}
		var eqb pgx.ExtendedQueryBuilder
		if eqb.Build(m, sd, q.Arguments) != nil {
			return p.owners[j]
		}
	}
	return -1
}

// unwrapStmt returns the statement error inside a *stmtError, or err.
func unwrapStmt(err error) error {
	if se, ok := err.(*stmtError); ok {
		return se.err
	}
	return err
}
