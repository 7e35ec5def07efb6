package kscopetest

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/txn"
)

// errRolledBack marks, in the kit's call counts, the records of a DB-scope
// batch call whose transaction rolled back because another record of it
// failed: their handler runs again, by design, and that is not a repeat.
var errRolledBack = errors.New("kscopetest: the batch's transaction rolled back for another record")

// batch runs one batch handler call of recs through the injector: each
// record's call is counted, and the first record the scenario fails makes
// the call fail at it (consumer.FailedAt), after handle ran for the
// records before it. rolledBack says that the scope rolls a failed call's
// records back and calls them again (the DB scope).
func (in *injector) batch(recs []*consumer.Record, idHeader string, rolledBack bool, handle func(recs []*consumer.Record) error) error {
	for i, r := range recs {
		ferr := in.before(r, idHeader)
		if ferr == nil {
			continue
		}
		err := error(consumer.FailedAt(i, ferr))
		if i > 0 {
			if herr := handle(recs[:i]); herr != nil {
				err = herr
			}
		}
		in.afterBatch(recs[:i+1], idHeader, rolledBack, err)
		return err
	}
	err := handle(recs)
	in.afterBatch(recs, idHeader, rolledBack, err)
	return err
}

// afterBatch notes the outcome err of a batch call of recs for each record.
func (in *injector) afterBatch(recs []*consumer.Record, idHeader string, rolledBack bool, err error) {
	at, ierr, ok := consumer.FailedIndex(err)
	for j, r := range recs {
		switch {
		case err == nil:
			in.after(r, idHeader, nil)
		case !ok || at < 0 || at >= len(recs):
			in.after(r, idHeader, err) // the batch is isolated: every record is called again
		case j == at:
			in.after(r, idHeader, ierr)
		case j < at && rolledBack:
			in.after(r, idHeader, errRolledBack)
		case j > at:
			in.unreached(r, idHeader) // the call stopped before it: the scope calls it again
		}
	}
}

// dbBatch builds a DB-scope runner of p's batch handler, its calls run
// through f.
func dbBatch(cfg consumer.Config, o dbscope.Options, h dbscope.BatchHandler, f *Faults) (kitRunner, error) {
	r, err := dbscope.NewBatch(cfg, o, dbscope.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
		return f.in.batch(recs, f.idHeader, true, func(recs []*consumer.Record) error { return h.HandleBatch(ctx, tx, recs) })
	}))
	if err != nil {
		return nil, err
	}
	return r, nil
}

// kafkaBatch builds a Kafka-scope runner of the pipeline's batch handler,
// its calls counted and failed by the scenario's injector.
func (h *kafkaHarness) kafkaBatch(cfg consumer.Config, opts txn.Options) (*txn.Runner, error) {
	return txn.NewBatch(cfg, opts, txn.BatchHandlerFunc(func(ctx context.Context, recs []*consumer.Record, out txn.BatchEmitter) error {
		return h.inject.batch(recs, kitIDHeader, false, func(recs []*consumer.Record) error { return h.p.BatchHandler.HandleBatch(ctx, recs, out) })
	}))
}
