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

// kitTopics matches the kit's input topics (kt-<scenario>-<run>) and not
// their retry topics (<group>.kscope-retry-<delay>), so that a record
// back from a retry topic reaches its handler through its original topic.
const kitTopics = `^kt-[^.]*$`

var errUnrouted = errors.New("a route no kit record takes")

func decodeOrder(r *consumer.Record) (string, error) {
	var order struct{ ID string }
	if err := json.Unmarshal(r.Value, &order); err != nil || order.ID == "" {
		return "", consumer.DecodeError(fmt.Errorf("bad order: %v", err))
	}
	return order.ID, nil
}

// The delivery-semantics table holds with a routed DB-scope pipeline.
func TestKitDBScopeRouted(t *testing.T) {
	router := dbscope.NewRouter().
		Pattern(`^audit\.`, dbscope.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Record) error { return errUnrouted })).
		Pattern(kitTopics, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			id, err := decodeOrder(r)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, id)
			return err
		}))
	rep := kscopetest.DB(t, kscopetest.DBPipeline{
		Handler:     router,
		Schema:      `CREATE TABLE orders (id text)`,
		Valid:       func(i int) *kgo.Record { return &kgo.Record{Value: fmt.Appendf(nil, `{"ID":"o-%d"}`, i)} },
		Undecodable: func() *kgo.Record { return &kgo.Record{Value: []byte("not json")} },
		Effects: func(ctx context.Context, db *pgxpool.Pool) (n int, err error) {
			err = db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
			return n, err
		},
	})
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
}

// The Kafka scope's table holds with a routed pipeline.
func TestKitKafkaScopeRouted(t *testing.T) {
	router := txn.NewRouter().
		Pattern(`^audit\.`, txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error { return errUnrouted })).
		Pattern(kitTopics, txn.HandlerFunc(func(_ context.Context, r *consumer.Record, out txn.Emitter) error {
			id, err := decodeOrder(r)
			if err != nil {
				return err
			}
			out.Emit(&kgo.Record{Topic: "kit-routed.accepted", Key: r.Key, Value: []byte(id)})
			return nil
		}))
	rep := kscopetest.Kafka(t, kscopetest.KafkaPipeline{
		Handler:         router,
		OutputTopics:    []string{"kit-routed.accepted"},
		OutputsPerInput: 1,
		Valid:           func(i int) *kgo.Record { return &kgo.Record{Value: fmt.Appendf(nil, `{"ID":"o-%d"}`, i)} },
		Undecodable:     func() *kgo.Record { return &kgo.Record{Value: []byte("not json")} },
	})
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
}
