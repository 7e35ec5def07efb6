package dbscope

// The inbox rows of a transaction's first round trip, written by one of two
// statements: a plain insert, when every record of the batch is likely new,
// or the checked insert (sqlInbox), which skips the ids already there and
// says which ids were new.

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/kscope-dev/kscope/retrytopic"
)

// checkedFor is how long every batch takes the checked insert after a
// plain insert met an id already in the inbox: a restarted member's first
// batches, redelivered, or a producer that sends duplicates often. A plain
// insert that meets one costs its transaction and a round trip.
const checkedFor = 10 * time.Second

// uniqueViolation is PostgreSQL's SQLSTATE for a duplicate key.
const uniqueViolation = "23505"

// inboxInsert chooses how a batch's inbox rows are written.
//
// The checked insert (INSERT … ON CONFLICT DO NOTHING RETURNING) is a
// speculative insertion in PostgreSQL: each row is looked up in the primary
// key, inserted, then confirmed, with a WAL record of its own. A plain
// insert checks the primary key as it inserts: a duplicate id fails the
// statement and aborts the transaction, before any handler ran. The
// transaction is then rolled back and opened again with the checked insert,
// so the outcome is the same (a duplicate is skipped, every new id gets its
// row); only the cost differs. Nothing of the failed transaction is kept.
type inboxInsert struct {
	// sqlNew inserts the batch's inbox rows, with no conflict clause.
	sqlNew string
	// checkedUntil is the time (Unix nanoseconds) before which every batch
	// takes the checked insert: set checkedFor after a plain insert met an
	// id already in the inbox.
	checkedUntil atomic.Int64
	// plain and conflicts count the batches that took the plain insert and
	// those of them that met an id already there.
	plain, conflicts atomic.Int64
}

// usePlain reports whether a batch with these records' metadata takes the
// plain insert: none of them is a retry-topic delivery or a parked record
// (whose ids the inbox holds, with their outcome) and no plain insert met
// an id already there within checkedFor.
func (in *inboxInsert) usePlain(metas []retrytopic.Metadata) bool {
	if time.Now().UnixNano() < in.checkedUntil.Load() {
		return false
	}
	for i := range metas {
		if metas[i].Attempt > 0 || metas[i].Parked {
			return false
		}
	}
	return true
}

// conflicted records that a plain insert met an id already in the inbox.
func (in *inboxInsert) conflicted() {
	in.conflicts.Add(1)
	in.checkedUntil.Store(time.Now().Add(checkedFor).UnixNano())
}

// isDuplicateID reports whether err is the plain insert's failure on an id
// already in the inbox.
func isDuplicateID(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == uniqueViolation
}
