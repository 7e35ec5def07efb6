package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/kscopetest"
	"github.com/kscope-dev/kscope/txn"
)

type order struct{ ID string }

func decodeOrder(r *consumer.Record) (order, error) {
	var o order
	if err := json.Unmarshal(r.Value, &o); err != nil || o.ID == "" {
		return o, consumer.DecodeError(fmt.Errorf("bad order: %v", err))
	}
	return o, nil
}

func validOrder(i int) *kgo.Record {
	return &kgo.Record{Value: []byte(fmt.Sprintf(`{"ID":"o-%d"}`, i))}
}

func undecodableOrder() *kgo.Record { return &kgo.Record{Value: []byte("not an order")} }

// The test kit's suites, here in the integration module so that they also
// run on real Apache Kafka and PostgreSQL with KSCOPE_TEST_CONTAINERS=1
// (make test-containers).
func TestKitDBScope(t *testing.T) {
	rep := kscopetest.DB(t, kscopetest.DBPipeline{
		Handler: dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			o, err := decodeOrder(r)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, o.ID)
			return err
		}),
		Schema:      `CREATE TABLE orders (id text)`,
		Valid:       validOrder,
		Undecodable: undecodableOrder,
		Effects: func(ctx context.Context, db *pgxpool.Pool) (n int, err error) {
			err = db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
			return n, err
		},
	})
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
}

// The Kafka scope's table with its idempotency guard: the duplicate and
// replay rows run too.
func TestKitKafkaScope(t *testing.T) {
	rep := kscopetest.Kafka(t, kscopetest.KafkaPipeline{
		Handler: txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
			o, err := decodeOrder(r)
			if err != nil {
				return err
			}
			out.Emit(&kgo.Record{Topic: "orders.accepted", Key: r.Key, Value: []byte(o.ID)})
			return nil
		}),
		OutputTopics:    []string{"orders.accepted"},
		OutputsPerInput: 1,
		Valid:           validOrder,
		Undecodable:     undecodableOrder,
		Options:         txn.Options{Dedupe: &txn.DedupeOptions{}},
	})
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
}

// The AtLeastOnce scope's table with its idempotency guard (a memory
// store): the duplicate, crash and replay rows run too.
func TestKitAtLeastOnceScope(t *testing.T) {
	var mu sync.Mutex
	var shipped []string
	store := dedupe.NewMemory(0)
	rep := kscopetest.AtLeastOnce(t, kscopetest.AtLeastOncePipeline{
		Handler: consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error {
			o, err := decodeOrder(r)
			if err != nil {
				return err
			}
			mu.Lock()
			shipped = append(shipped, o.ID)
			mu.Unlock()
			return nil
		}),
		Config: func(c consumer.Config) consumer.Config {
			c.Dedupe = consumer.DedupeConfig{Store: store}
			return c
		},
		Valid:       validOrder,
		Undecodable: undecodableOrder,
		Effects: func(context.Context) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return len(shipped), nil
		},
	})
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
}

// The kit's share-group table against the same DB-scope pipeline as a
// member of a share group: on Apache Kafka too with KSCOPE_KAFKA=apache.
func TestKitDBScopeShare(t *testing.T) {
	rep := kscopetest.DBShare(t, kscopetest.DBPipeline{
		Handler: dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			o, err := decodeOrder(r)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, o.ID)
			return err
		}),
		Schema: `CREATE TABLE orders (id text)`,
		Valid:  validOrder,
		Effects: func(ctx context.Context, db *pgxpool.Pool) (n int, err error) {
			err = db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
			return n, err
		},
	})
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
}
