package dbscope

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// maxSavepoints is the most record savepoints one transaction takes. A
// savepoint whose record writes becomes a subtransaction with an id of its
// own, which PostgreSQL keeps in a per-backend cache of 64 until the
// transaction ends; past 64 the cache overflows and every other session's
// snapshots get slower. Records beyond it go to the next transaction.
const maxSavepoints = 64

const (
	savepointSQL = "SAVEPOINT kscope_record"
	releaseSQL   = "RELEASE SAVEPOINT kscope_record"
	rollbackSQL  = "ROLLBACK TO SAVEPOINT kscope_record"
)

// errHandlerEndsTx is what a handler gets when it commits or rolls back the
// transaction it was given.
var errHandlerEndsTx = errors.New("dbscope: a handler must not commit or roll back its transaction; return nil to commit its writes or an error to roll them back")

// recordTx is the pgx.Tx a Handler receives: its batch's transaction, in
// which the record's first statement is preceded by a savepoint. A failing
// record's writes roll back to it alone, so the records before it in the
// batch keep theirs and their handlers do not run again. A handler that
// fails before its first statement costs nothing to undo, and one that
// succeeds costs no extra round trip when its first statement is an Exec
// with arguments (the savepoint travels with it).
type recordTx struct {
	tx      pgx.Tx
	ctx     context.Context // the handler's, for the calls that take none
	touched bool            // the handler used the transaction
	sp      bool            // the savepoint was taken
	err     error           // taking the savepoint failed: the handler may not write
	// release: an earlier record's savepoint is still open. It is
	// released with the next record's savepoint, in the same round trip,
	// so that savepoints do not nest.
	release bool
}

var _ pgx.Tx = (*recordTx)(nil)

// reset readies t for the next record's handler.
func (t *recordTx) reset(ctx context.Context) {
	t.release = t.release || t.sp
	t.ctx, t.touched, t.sp, t.err = ctx, false, false, nil
}

// take takes the savepoint before the handler's first use of the
// transaction.
func (t *recordTx) take(ctx context.Context) error {
	if t.touched {
		return t.err
	}
	t.touched = true
	sql := savepointSQL
	if t.release {
		sql = releaseSQL + "; " + savepointSQL // a simple query: one round trip
	}
	if _, err := t.tx.Exec(ctx, sql); err != nil {
		t.err = err
		return err
	}
	t.sp, t.release = true, false
	return nil
}

// rollback undoes what the handler wrote.
func (t *recordTx) rollback(ctx context.Context) error {
	_, err := t.tx.Exec(ctx, rollbackSQL)
	return err
}

// Exec runs sql in the transaction; the first statement of a record takes
// the savepoint in the same round trip. pgx prepares a statement new to
// the connection before it runs the batch: one PostgreSQL refuses aborts
// the transaction before the savepoint (batchTx.runHandler then fails the
// record in a new transaction).
func (t *recordTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.refuse(sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	if t.touched {
		if t.err != nil {
			return pgconn.CommandTag{}, t.err
		}
		return t.tx.Exec(ctx, sql, args...)
	}
	if _, mode := firstArg(args).(pgx.QueryExecMode); len(args) == 0 || mode {
		// No arguments (pgx runs it as a simple query, which may hold
		// several statements) or a mode a batch cannot take: the
		// savepoint goes first on its own.
		if err := t.take(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return t.tx.Exec(ctx, sql, args...)
	}
	t.touched = true
	b := &pgx.Batch{}
	if t.release {
		b.Queue(releaseSQL)
	}
	b.Queue(savepointSQL)
	b.Queue(sql, args...)
	br := t.tx.SendBatch(ctx, b)
	for range b.Len() - 1 {
		if _, err := br.Exec(); err != nil {
			br.Close() //nolint:errcheck // err says it
			t.err = err
			return pgconn.CommandTag{}, err
		}
	}
	t.sp, t.release = true, false
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return tag, err
}

func firstArg(args []any) any {
	if len(args) == 0 {
		return nil
	}
	return args[0]
}

// Query runs sql in the transaction, after the record's savepoint.
func (t *recordTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.refuse(sql); err != nil {
		return nil, err
	}
	if err := t.take(ctx); err != nil {
		return nil, err
	}
	return t.tx.Query(ctx, sql, args...)
}

// QueryRow runs sql in the transaction, after the record's savepoint.
func (t *recordTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.refuse(sql); err != nil {
		return errRow{err}
	}
	if err := t.take(ctx); err != nil {
		return errRow{err}
	}
	return t.tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends b in the transaction, after the record's savepoint.
func (t *recordTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.refuseBatch(b); err != nil {
		return errBatch{err}
	}
	if err := t.take(ctx); err != nil {
		return errBatch{err}
	}
	return t.tx.SendBatch(ctx, b)
}

// CopyFrom copies rows in the transaction, after the record's savepoint.
func (t *recordTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.take(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares a statement on the transaction's connection, after the
// record's savepoint.
func (t *recordTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.refuse(sql); err != nil {
		return nil, err
	}
	if err := t.take(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// Begin starts a pseudo nested transaction (a savepoint of the handler's
// own), after the record's savepoint.
func (t *recordTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.take(ctx); err != nil {
		return nil, err
	}
	n, err := t.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &nestedTx{Tx: n, owner: t}, nil
}

// refuse fails the record when sql would end the batch's transaction
// (endsTx): the statement is not sent, and the handler's later statements
// get the same error.
func (t *recordTx) refuse(sql string) error {
	cmd := endsTx(sql)
	if cmd == "" {
		return nil
	}
	if t.err == nil {
		t.err = errEndsTx(cmd)
	}
	t.touched = true
	return t.err
}

// refuseBatch is refuse for every statement of b.
func (t *recordTx) refuseBatch(b *pgx.Batch) error {
	for _, q := range b.QueuedQueries {
		if err := t.refuse(q.SQL); err != nil {
			return err
		}
	}
	return nil
}

// nestedTx is a handler's nested transaction (recordTx.Begin, a savepoint
// of its own): its SQL may not end the batch's transaction either.
type nestedTx struct {
	pgx.Tx
	owner *recordTx
}

// Exec runs sql in the nested transaction.
func (n *nestedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := n.owner.refuse(sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	return n.Tx.Exec(ctx, sql, args...)
}

// Query runs sql in the nested transaction.
func (n *nestedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := n.owner.refuse(sql); err != nil {
		return nil, err
	}
	return n.Tx.Query(ctx, sql, args...)
}

// QueryRow runs sql in the nested transaction.
func (n *nestedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := n.owner.refuse(sql); err != nil {
		return errRow{err}
	}
	return n.Tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends b in the nested transaction.
func (n *nestedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := n.owner.refuseBatch(b); err != nil {
		return errBatch{err}
	}
	return n.Tx.SendBatch(ctx, b)
}

// Prepare prepares sql on the nested transaction's connection.
func (n *nestedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := n.owner.refuse(sql); err != nil {
		return nil, err
	}
	return n.Tx.Prepare(ctx, name, sql)
}

// Begin starts a transaction nested in this one.
func (n *nestedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	in, err := n.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &nestedTx{Tx: in, owner: n.owner}, nil
}

// LargeObjects returns the transaction's large objects, after the
// record's savepoint.
func (t *recordTx) LargeObjects() pgx.LargeObjects {
	t.take(t.ctx) //nolint:errcheck // kept in t.err: the record fails
	return t.tx.LargeObjects()
}

// Conn returns the transaction's connection, after the record's savepoint.
func (t *recordTx) Conn() *pgx.Conn {
	t.take(t.ctx) //nolint:errcheck // kept in t.err: the record fails
	return t.tx.Conn()
}

// Commit refuses: the scope commits the batch's transaction.
func (t *recordTx) Commit(context.Context) error { return errHandlerEndsTx }

// Rollback refuses: return an error to roll back the record's writes.
func (t *recordTx) Rollback(context.Context) error { return errHandlerEndsTx }

// errRow is a pgx.Row whose query could not be sent.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errBatch is a pgx.BatchResults whose batch could not be sent.
type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
