package kscopetest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/kscopetest"
	"github.com/kscope-dev/kscope/txn"
)

// orderID decodes a record's order id; a record that is not an order is
// poison.
func orderID(r *consumer.Record) (string, error) {
	var o struct{ ID string }
	if err := json.Unmarshal(r.Value, &o); err != nil || o.ID == "" {
		return "", consumer.DecodeError(errors.New("not an order"))
	}
	return o.ID, nil
}

func validOrder(i int) *kgo.Record {
	return &kgo.Record{Value: fmt.Appendf(nil, `{"ID":"o-%d"}`, i)}
}

func notAnOrder() *kgo.Record { return &kgo.Record{Value: []byte("not an order")} }

// The kit's table holds for a DB-scope batch handler that writes its
// records with one COPY: duplicates, crashes, failures and replays apply
// each record once.
func TestKitDBScopeBatchHandler(t *testing.T) {
	rep := kscopetest.DB(t, kscopetest.DBPipeline{
		BatchHandler: dbscope.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
			rows := make([][]any, len(recs))
			for i, r := range recs {
				id, err := orderID(r)
				if err != nil {
					return consumer.FailedAt(i, err)
				}
				rows[i] = []any{id}
			}
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"id"}, pgx.CopyFromRows(rows))
			return err
		}),
		Schema:      `CREATE TABLE orders (id text)`,
		Valid:       validOrder,
		Undecodable: notAnOrder,
		Effects: func(ctx context.Context, db *pgxpool.Pool) (n int, err error) {
			err = db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
			return n, err
		},
	})
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
}

// The kit's Kafka table holds for a Kafka-scope batch handler: each
// record's outputs commit once with its offset.
func TestKitKafkaScopeBatchHandler(t *testing.T) {
	rep := kscopetest.Kafka(t, kscopetest.KafkaPipeline{
		BatchHandler: txn.BatchHandlerFunc(func(_ context.Context, recs []*consumer.Record, out txn.BatchEmitter) error {
			for i, r := range recs {
				id, err := orderID(r)
				if err != nil {
					return consumer.FailedAt(i, err)
				}
				out.Emit(i, &kgo.Record{Topic: "orders.accepted", Key: r.Key, Value: []byte(id)})
			}
			return nil
		}),
		OutputTopics:    []string{"orders.accepted"},
		OutputsPerInput: 1,
		Valid:           validOrder,
		Undecodable:     notAnOrder,
	})
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
}
