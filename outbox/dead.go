package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
)

// ErrNotDead says that the dead-letter table holds no row of an identity:
// it was requeued or discarded already, or never dead-lettered.
var ErrNotDead = errors.New("kscope: outbox: no dead-letter row of that identity (requeued or discarded already, or never dead-lettered)")

// DB is what DeadLetters needs of the database: a *pgxpool.Pool, a
// *pgx.Conn, or a pgx.Tx (its changes then commit with that transaction).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// DeadLetters reads and empties the dead-letter table of the outboxes of
// one database (<TablePrefix>outbox_dead): the rows a relay moved there
// because Kafka refuses them for good (see the package doc, "Rows Kafka
// refuses"). The kscope CLI's "outbox dead" commands are built on it.
type DeadLetters struct {
	// DB is the database the outbox tables are in. Required.
	DB DB
	// TablePrefix is the prefix dbscope.Migrate was given. Default
	// dbscope.DefaultTablePrefix.
	TablePrefix string
}

// DeadRow is a row of the dead-letter table.
type DeadRow struct {
	// ID is the row's identity, the kscope-id header its record carries
	// when published: "<outbox>/<partition>/<seq>" of the row as its
	// writer added it, kept by Requeue.
	ID        string
	Outbox    string
	Partition int
	// Seq is the row's sequence number when it was dead-lettered: ID's,
	// unless the row was requeued and dead-lettered again.
	Seq   int64
	Topic string
	Key   []byte
	// Value and Headers are nil in the rows List returns; Get reads them.
	Value   []byte
	Headers []kgo.RecordHeader
	// HeadersErr says why the stored headers could not be decoded (a row
	// that kscope did not write); the relay publishes such a row without
	// them.
	HeadersErr error
	// Size is the bytes of the key, the value and the stored headers, as
	// the relay's log line counts them.
	Size int
	// Created is when the writing transaction added the row (for a row
	// requeued before, when it was requeued); Dead when the relay moved
	// it here.
	Created, Dead time.Time
	// Error is what the producer or the broker answered.
	Error string
}

// Requeued is where Requeue put a row back.
type Requeued struct {
	// ID is the row's identity, unchanged.
	ID        string
	Outbox    string
	Partition int
	// Seq is the row's new sequence number, at the end of its partition.
	Seq   int64
	Topic string
	// Copies is how many dead-letter rows of the identity were removed:
	// 1, or more when a relay dead-lettered it again after a crash.
	Copies int
}

func (d DeadLetters) prefix() (string, error) {
	if d.DB == nil {
		return "", errors.New("kscope: outbox.DeadLetters.DB is nil; pass the *pgxpool.Pool of the database the outbox is in")
	}
	p := d.TablePrefix
	if p == "" {
		p = dbscope.DefaultTablePrefix
	}
	return p, dbscope.ValidTablePrefix(p)
}

// identSQL is the identity of a row of the outbox or dead-letter table:
// the one it holds, else its place.
const identSQL = `coalesce(id, outbox || '/' || partition || '/' || seq)`

// List returns the dead rows of the outbox named outbox ("" for every
// outbox), in the order of outbox, partition and sequence number, which
// is the order the relay met them in a partition. Their Value and
// Headers are left out (they may be large); Get reads them.
func (d DeadLetters) List(ctx context.Context, outbox string) ([]DeadRow, error) {
	p, err := d.prefix()
	if err != nil {
		return nil, err
	}
	rows, err := d.DB.Query(ctx, `SELECT `+identSQL+`, outbox, partition, seq, topic, key,
		coalesce(octet_length(key), 0) + coalesce(octet_length(value), 0) + coalesce(octet_length(headers), 0),
		created_at, dead_at, error
		FROM `+p+`outbox_dead WHERE $1 = '' OR outbox = $1 ORDER BY outbox, partition, seq`, outbox)
	if err != nil {
		return nil, d.failed(ctx, p, "listing the dead-letter rows", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadRow, error) {
		var w DeadRow
		var part int32
		err := r.Scan(&w.ID, &w.Outbox, &part, &w.Seq, &w.Topic, &w.Key, &w.Size, &w.Created, &w.Dead, &w.Error)
		w.Partition = int(part)
		return w, err
	})
	if err != nil {
		return nil, d.failed(ctx, p, "listing the dead-letter rows", err)
	}
	return out, nil
}

// Get returns the dead row of identity id, in full; ErrNotDead when there
// is none. An identity dead-lettered twice (a relay that crashed after
// writing the row, and dead-lettered it again) is returned once, its
// first copy.
func (d DeadLetters) Get(ctx context.Context, id string) (DeadRow, error) {
	p, err := d.prefix()
	if err != nil {
		return DeadRow{}, err
	}
	rows, err := d.DB.Query(ctx, `SELECT `+identSQL+`, outbox, partition, seq, topic, key, value, headers, created_at, dead_at, error
		FROM `+p+`outbox_dead WHERE `+identSQL+` = $1 ORDER BY seq LIMIT 1`, id)
	if err != nil {
		return DeadRow{}, d.failed(ctx, p, "reading the dead-letter row", err)
	}
	w, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (DeadRow, error) {
		var w DeadRow
		var part int32
		var hs []byte
		err := r.Scan(&w.ID, &w.Outbox, &part, &w.Seq, &w.Topic, &w.Key, &w.Value, &hs, &w.Created, &w.Dead, &w.Error)
		w.Partition = int(part)
		w.Size = len(w.Key) + len(w.Value) + len(hs)
		w.Headers, w.HeadersErr = decodeHeaders(hs)
		return w, err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadRow{}, fmt.Errorf("%w: %s", ErrNotDead, id)
	}
	if err != nil {
		return DeadRow{}, d.failed(ctx, p, "reading the dead-letter row", err)
	}
	return w, nil
}

// Requeue moves the dead row of identity id back into its outbox, to be
// published once its relay reaches it; ErrNotDead when the table holds no
// row of id. In one transaction, it deletes the row (every copy of it)
// from the dead-letter table and adds it at the end of its partition,
// numbered through the partition's sequence row as outbox.Add numbers
// rows, so the partition stays gapless and in commit order: the row is in
// exactly one of the two tables whatever happens. The row keeps its
// identity: its record carries the kscope-id header it was written with,
// so a consumer that saw it already (the relay can, rarely, have
// published it before dead-lettering it) drops the copy. Relays of a
// kscope before Requeue publish it under the identity of its new place
// instead: upgrade them first.
//
// topic, when not empty, replaces the row's topic: a row dead-lettered
// because its topic name is not one Kafka allows is refused without one.
//
// The record is published after the records of its key added since it
// was written: per-key order is not restored. Requeue the rows of one key
// in List's order to publish them in the order they were written. A row
// Kafka still refuses is dead-lettered again, with its identity; fix the
// cause first (see the package doc, "Rows Kafka refuses").
func (d DeadLetters) Requeue(ctx context.Context, id, topic string) (Requeued, error) {
	p, err := d.prefix()
	if err != nil {
		return Requeued{}, err
	}
	if topic != "" && !ValidTopic(topic) {
		return Requeued{}, fmt.Errorf("kscope: outbox: requeue: %q is not a Kafka topic name; use at most 249 of a-z A-Z 0-9 . _ -", topic)
	}
	var out Requeued
	err = pgx.BeginFunc(ctx, d.DB, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `DELETE FROM `+p+`outbox_dead WHERE `+identSQL+` = $1
			RETURNING outbox, partition, seq, topic, key, value, headers`, id)
		if err != nil {
			return err
		}
		type dead struct {
			outbox, topic      string
			partition          int32
			seq                int64
			key, value, header []byte
		}
		copies, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dead, error) {
			var w dead
			err := r.Scan(&w.outbox, &w.partition, &w.seq, &w.topic, &w.key, &w.value, &w.header)
			return w, err
		})
		if err != nil {
			return err
		}
		if len(copies) == 0 {
			return fmt.Errorf("%w: %s", ErrNotDead, id)
		}
		w := slices.MinFunc(copies, func(a, b dead) int { return cmp.Compare(a.seq, b.seq) })
		if topic == "" {
			topic = w.topic
		}
		if !ValidTopic(topic) {
			return fmt.Errorf("its topic %q is not a Kafka topic name, so the relay would dead-letter it again; requeue it with the topic it is meant for", topic)
		}
		out = Requeued{ID: id, Outbox: w.outbox, Partition: int(w.partition), Topic: topic, Copies: len(copies)}
		// As Writer.insertSQL, with the identity.
		return tx.QueryRow(ctx, `WITH s AS (
			INSERT INTO `+p+`outbox_sequences AS s (outbox, partition, next_seq) VALUES ($1, $2, 2)
			ON CONFLICT (outbox, partition) DO UPDATE SET next_seq = s.next_seq + 1
			RETURNING next_seq - 1 AS seq)
		INSERT INTO `+p+`outbox (outbox, partition, seq, topic, key, value, headers, id)
		SELECT $1, $2, s.seq, $3, $4, $5, $6, $7 FROM s
		RETURNING seq`, w.outbox, w.partition, topic, w.key, w.value, w.header, id).Scan(&out.Seq)
	})
	if err != nil {
		if errors.Is(err, ErrNotDead) {
			return Requeued{}, err
		}
		return Requeued{}, d.failed(ctx, p, "requeue "+id, err)
	}
	return out, nil
}

// Discard deletes the dead row of identity id (every copy of it): its
// record is never published. ErrNotDead when there is none.
func (d DeadLetters) Discard(ctx context.Context, id string) error {
	p, err := d.prefix()
	if err != nil {
		return err
	}
	var n int64
	err = pgx.BeginFunc(ctx, d.DB, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM `+p+`outbox_dead WHERE `+identSQL+` = $1`, id)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return d.failed(ctx, p, "discard "+id, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %s", ErrNotDead, id)
	}
	return nil
}

// failed wraps err of what; a missing table or column is reported as a
// *dbscope.SchemaError, which says to run Migrate.
func (d DeadLetters) failed(ctx context.Context, prefix, what string, err error) error {
	return fmt.Errorf("kscope: outbox: %s: %w", what, schemaErr(ctx, d.DB, prefix, err))
}

// schemaParts are the tables ("table") and columns ("table.column") of
// the outbox, without the table prefix, that the relay and DeadLetters
// use.
var schemaParts = [][2]string{{"outbox", ""}, {"outbox_sequences", ""}, {"outbox_dead", ""}, {"outbox", "id"}, {"outbox_dead", "id"}}

// missingSchema returns those of schemaParts the database lacks, with
// prefix: "kscope_outbox_dead", "kscope_outbox.id".
func missingSchema(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, prefix string) ([]string, error) {
	tables, cols := make([]string, len(schemaParts)), make([]string, len(schemaParts))
	for i, s := range schemaParts {
		tables[i], cols[i] = prefix+s[0], s[1]
	}
	rows, err := db.Query(ctx, `SELECT t || CASE WHEN c = '' THEN '' ELSE '.' || c END FROM unnest($1::text[], $2::text[]) AS x(t, c)
		WHERE CASE WHEN c = '' THEN to_regclass(t) IS NULL
			ELSE to_regclass(t) IS NOT NULL AND NOT EXISTS (
				SELECT FROM pg_attribute a WHERE a.attrelid = to_regclass(t) AND a.attname = c AND NOT a.attisdropped) END`, tables, cols)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// schemaErr returns err, or a *dbscope.SchemaError naming what the
// database lacks when err is PostgreSQL not finding a table or column of
// the outbox.
func schemaErr(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, prefix string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" && pgErr.Code != "42703" { // undefined_table, undefined_column
		return err
	}
	missing, cerr := missingSchema(context.WithoutCancel(ctx), db, prefix)
	if cerr != nil || len(missing) == 0 {
		return err
	}
	return &dbscope.SchemaError{Prefix: prefix, Missing: missing}
}
