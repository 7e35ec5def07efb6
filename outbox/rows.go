package outbox

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// The outbox rows a publisher reads, their identities, and the check that
// they belong to its partition.

// row is one outbox row.
type row struct {
	seq int64
	// id is the row's identity when the row holds one (a row requeued
	// from the dead-letter table keeps the one it was written with), ""
	// when it is the row's place: see publisher.ident.
	id      string
	topic   string
	key     []byte
	value   []byte
	headers []byte
	created time.Time
}

// id is the identity of the partition's row seq.
func (pub *publisher) id(seq int64) string {
	return pub.r.o.Outbox + "/" + strconv.Itoa(pub.p) + "/" + strconv.FormatInt(seq, 10)
}

// ident is the identity w's record carries in its kscope-id header: the
// one the row holds (a requeued row's, from when it was written), else
// its place, id(w.seq).
func (pub *publisher) ident(w row) string {
	if w.id != "" {
		return w.id
	}
	return pub.id(w.seq)
}

// read returns the partition's rows after pos, in sequence order, at most
// BatchSize of them.
func (pub *publisher) read(ctx context.Context, pos int64) ([]row, error) {
	r := pub.r
	rows, err := r.o.Pool.Query(ctx, `SELECT seq, coalesce(id, ''), topic, key, value, headers, created_at FROM `+r.o.TablePrefix+`outbox
		WHERE outbox = $1 AND partition = $2 AND seq > $3 ORDER BY seq LIMIT $4`, r.o.Outbox, int32(pub.p), pos, r.o.BatchSize)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(rs pgx.CollectableRow) (row, error) {
		var w row
		err := rs.Scan(&w.seq, &w.id, &w.topic, &w.key, &w.value, &w.headers, &w.created)
		return w, err
	})
}

// misplaced counts and reports the rows whose key does not hash to this
// partition under the relay's Partitions: a Writer with fewer partitions
// than the relay wrote them (one with more writes rows the relay does not
// publish at all: watchStranded). They are published, but a key whose rows
// sit in two partitions is published side by side, not in order. Each row
// is counted once, however often it is read.
func (pub *publisher) misplaced(log *slog.Logger, rows []row) {
	n := 0
	var first row
	for _, w := range rows {
		if w.seq <= pub.checkedTo {
			continue
		}
		pub.checkedTo = w.seq
		if partitionOf(w.key, pub.r.o.Partitions) != pub.p {
			if n == 0 {
				first = w
			}
			n++
		}
	}
	if n == 0 {
		return
	}
	pub.r.misplacedRows.Add(int64(n))
	if held, ok := pub.misplacedLog.allow(); ok {
		log.Error("kscope: outbox relay: rows whose key hashes to another partition of the outbox: a Writer with another Partitions than the relay's wrote them "+
			"(Writer.Partitions must be the relay's). They are published, but a key whose rows sit in two partitions is published out of order; give every Writer the relay's Partitions. "+
			"At most one such line is logged every 30 seconds",
			"rows", n+held, "seq", first.seq, "relay_partitions", pub.r.o.Partitions)
	} else {
		pub.misplacedLog.held += n - 1
	}
}
