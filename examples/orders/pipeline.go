package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/codec"
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
)

// Order is an orders.placed record: Avro, in the Confluent wire format
// through the schema registry.
type Order struct {
	ID       string `avro:"id"`
	Customer string `avro:"customer"`
	Cents    int64  `avro:"cents"`
}

// orderSchema is Order's Avro schema, registered under the topic's value
// subject (codec.TopicName).
const orderSchema = `{"type":"record","name":"Order","namespace":"shop","fields":[
	{"name":"id","type":"string"},{"name":"customer","type":"string"},{"name":"cents","type":"long"}]}`

// Shipped and Cancelled are orders.updates records: JSON, told apart by
// their event-type header.
type Shipped struct {
	Order   string `json:"order"`
	Carrier string `json:"carrier"`
}

// Cancelled is the JSON of a "cancelled" orders.updates record.
type Cancelled struct {
	Order  string `json:"order"`
	Reason string `json:"reason"`
}

const schemaSQL = `
CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, customer text NOT NULL, cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS order_events (order_id text NOT NULL, event text NOT NULL, detail text NOT NULL);`

// newOrders is the orders.placed consumer: a DB-scope batch handler that
// decodes the records of one transaction and writes their orders with one
// COPY. Each record is still applied exactly once: the COPY commits with
// the records' inbox rows, and a record whose payload does not decode
// (FailedAt) goes to the dead-letter topic alone while the others commit.
func newOrders(cfg consumer.Config, pool *pgxpool.Pool, orders codec.Codec[Order]) (*dbscope.Runner, error) {
	return dbscope.NewBatch(cfg, dbscope.Options{Pool: pool, BatchSize: 256, BatchLinger: 5 * time.Millisecond},
		dbscope.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
			rows := make([][]any, len(recs))
			for i, r := range recs {
				o, err := consumer.DecodeValue(ctx, orders, r)
				if err != nil {
					return consumer.FailedAt(i, err) // the records before it are written below
				}
				rows[i] = []any{o.ID, o.Customer, o.Cents}
			}
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"id", "customer", "cents"}, pgx.CopyFromRows(rows))
			return err
		}))
}

// newUpdates is the orders.updates consumer: a router sends each record
// to the typed handler of its event type, through a middleware chain; an
// event type no route names goes to the dead-letter topic.
func newUpdates(cfg consumer.Config, pool *pgxpool.Pool, log *slog.Logger) (*dbscope.Runner, error) {
	router := dbscope.NewRouter().
		Header(cfg.Topics[0], "event-type", "shipped", dbscope.Typed(codec.JSON[Shipped](),
			func(ctx context.Context, tx pgx.Tx, r *consumer.Record, s Shipped) error {
				return event(ctx, tx, s.Order, "shipped", s.Carrier)
			})).
		Header(cfg.Topics[0], "event-type", "cancelled", dbscope.Typed(codec.JSON[Cancelled](),
			func(ctx context.Context, tx pgx.Tx, r *consumer.Record, c Cancelled) error {
				return event(ctx, tx, c.Order, "cancelled", c.Reason)
			}))
	cfg.HandlerTimeout = 5 * time.Second // a hung statement fails the call, retried as transient
	return dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.Chain(router, dbscope.Recover(), slowCalls(log, 500*time.Millisecond)))
}

// event records one order event in the record's transaction.
func event(ctx context.Context, tx pgx.Tx, order, name, detail string) error {
	_, err := tx.Exec(ctx, `INSERT INTO order_events (order_id, event, detail) VALUES ($1, $2, $3)`, order, name, detail)
	return err
}

// slowCalls is a middleware: it logs the handler calls that take longer
// than limit, with the record's coordinates.
func slowCalls(log *slog.Logger, limit time.Duration) dbscope.Middleware {
	return func(next dbscope.Handler) dbscope.Handler {
		return dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			start := time.Now()
			err := next.Handle(ctx, tx, r)
			if took := time.Since(start); took > limit {
				log.Warn("orders: slow handler call", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "took", took)
			}
			return err
		})
	}
}
