package dbscope

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
)

// BatchHandler applies the records of one transaction together, in the DB
// scope: it is called once per transaction with the records that reach
// the handler (not a duplicate the inbox knows, not a record waiting
// behind its key's head, its version checked), in offset order, after
// their inbox rows are in, with the transaction they commit in. It may
// write the whole batch with one statement (tx.CopyFrom, a multi-row
// INSERT): the inbox rows and the effects commit together, so each
// record's effect is still applied exactly once. The records may be of
// several keys; per-key order holds. Its error says what became of each
// record:
//
//   - nil: every record applied;
//   - consumer.FailedAt(i, err): record i failed with err. The transaction
//     is rolled back and run again without record i (its handler is not
//     called for it), which the failure policy routes on its own, as a
//     [Handler]'s error (a retry in place, a retry topic, the dead-letter
//     topic, a skip, whose writes are then lost); the records of record
//     i's key after it wait behind it, as they would behind a failing
//     [Handler]'s record, and the other records, those before i
//     included, are handled again in the new transaction, which commits
//     them;
//   - any other error (a panic, or the transaction left aborted by a
//     statement that failed): no record is known to have applied. The
//     transaction is rolled back and run again one record at a time, the
//     handler called with a one-record slice after a savepoint of the
//     record's own, as a [Handler] is, so that each record gets an outcome
//     of its own.
//
// A transient error (see [IsTransient]: a deadlock, a statement timeout, a
// lost connection) or a deployment error ([IsDeploymentError]), returned
// as it is or through FailedAt, retries the transaction after a backoff,
// as for a [Handler]. Records that the admission rules turn away
// (consumer.Config.Keep, MaxAge) are not passed to it: they end as
// those rules say, in the same transaction. The handler must not commit or
// roll back tx. With Options.Versions, a call takes no two records of one
// key: a batch goes on in further calls, in the same transaction, from
// the first record whose key the call already has.
type BatchHandler interface {
	HandleBatch(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error
}

// BatchHandlerFunc adapts a function to [BatchHandler].
type BatchHandlerFunc func(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error

// HandleBatch calls f(ctx, tx, recs).
func (f BatchHandlerFunc) HandleBatch(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
	return f(ctx, tx, recs)
}

// NewBatch returns a runner in the DB scope whose handler applies the
// records of a transaction together (see [BatchHandler]). Everything [New]
// says holds, record by record: one inbox row per record in the same
// transaction as its effects, the offset committed only after that
// transaction, a failing record routed by the failure policy on its own.
// A transaction takes up to Options.BatchSize records. It refuses
// consumer.Config.KeyBreaker: a call takes the records of many keys at
// once, so no key can be held alone.
func NewBatch(cfg consumer.Config, o Options, h BatchHandler) (*Runner, error) {
	if h == nil {
		return nil, &consumer.ConfigError{Struct: "dbscope.NewBatch's handler", Reason: "is nil; pass the function that applies each batch of records in its transaction"}
	}
	if cfg.KeyBreaker != nil {
		return nil, &consumer.ConfigError{Field: "KeyBreaker", Reason: "is set for a batch handler (dbscope.NewBatch), whose calls take the records of many keys at once; " +
			"the circuit breaker of each key holds one key's records: use a per-record handler (dbscope.New or dbscope.NewQueued), or leave KeyBreaker nil"}
	}
	return newRunner(cfg, o, nil, nil, h)
}

// errIsolateBatch says that a batch handler's call failed with no record
// named: the transaction runs again one record at a time.
var errIsolateBatch = errors.New("dbscope: the batch handler failed; rerun its records one at a time")

// callOne runs the batch handler for r alone, as a Handler is run (see
// call). A FailedAt(0, err) is r's failure err.
func (s *dbScope) callOne(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
	one := []*consumer.Record{r}
	err := s.eng.Call(ctx, r, func(ctx context.Context) error { return s.bh.HandleBatch(ctx, tx, one) })
	if i, ierr, ok := consumer.FailedIndex(err); ok && i == 0 {
		return ierr
	}
	return err
}

// toBatch decides record i, which reached the handler in a batch
// transaction: it fails with the error an earlier try learnt (known), is
// turned away by the admission rules, or joins the records the next batch
// call takes. With versions, a record of a key the call already has makes
// the call run first, so that its version is checked after the earlier
// one's is saved.
func (b *batchTx) toBatch(i int) error {
	r := b.work[i]
	herr := b.known[i]
	if herr == nil {
		herr = b.s.eng.Admit(r)
	}
	if herr != nil {
		if b.s.f.Class(herr) == consumer.ClassSkip {
			return b.succeed(i, herr) // a business skip, without writes
		}
		return b.failed(i, herr)
	}
	b.ready = append(b.ready, i)
	return nil
}

// readyHas reports whether the next batch call already takes a record of
// record i's key (only asked with versions checked, before the version
// check reads the key's last version).
func (b *batchTx) readyHas(i int) bool {
	k := b.work[i].Key
	for _, j := range b.ready {
		if string(b.work[j].Key) == string(k) {
			return true
		}
	}
	return false
}

// runBatch calls the batch handler with the ready records, in the
// transaction, and records what it said. A failure ends the try: an
// *isolateError for a FailedAt (the try runs again with that record
// known), errIsolateBatch for any other (the try runs again one record at
// a time), a *transientError for a transient or deployment error.
func (b *batchTx) runBatch() error {
	if len(b.ready) == 0 {
		return nil
	}
	ready := b.ready
	b.ready = nil
	recs := make([]*consumer.Record, len(ready))
	for j, i := range ready {
		recs[j] = b.work[i]
	}
	s := b.s
	rtx := &recordTx{tx: b.tx, touched: true} // no savepoint: a failure reruns the transaction
	herr := s.eng.CallBatch(b.ctx, recs, func(ctx context.Context) error {
		rtx.ctx = ctx
		return s.bh.HandleBatch(ctx, rtx, recs)
	})
	if b.tx.Conn().IsClosed() {
		return &transientError{rec: recs[0], err: firstErr(herr, errConnLost)}
	}
	aborted := b.tx.Conn().PgConn().TxStatus() == 'E'
	if herr == nil && !aborted {
		for _, i := range ready {
			if err := b.succeed(i, nil); err != nil {
				return err
			}
		}
		return nil
	}
	at, cause := -1, herr
	if j, ierr, ok := consumer.FailedIndex(herr); ok && j >= 0 && j < len(ready) {
		at, cause = j, ierr
	}
	if cause != nil && (s.transient(cause) || s.deployment(cause)) {
		return &transientError{rec: recs[max(at, 0)], err: cause}
	}
	if at < 0 {
		return errIsolateBatch
	}
	return &isolateError{i: ready[at], err: cause}
}
