package integration

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/kscope-dev/kscope/codec"
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/kscopetest"
	"github.com/kscope-dev/kscope/txn"
)

type avroOrder struct {
	ID string `avro:"id"`
}

const avroOrderSchema = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"}]}`

// avroOrders returns the Avro registry codec of orders on an in-process
// schema registry, and the kit's inputs in its wire format: valid orders,
// and an undecodable record (a wrong magic byte).
func avroOrders(t *testing.T) (c codec.Codec[avroOrder], valid func(int) *kgo.Record, undecodable func() *kgo.Record) {
	t.Helper()
	reg := srfake.New()
	t.Cleanup(reg.Close)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	c, err = codec.RegistryAvro[avroOrder](codec.Registry{Client: cl, Subject: codec.RecordName, AutoRegister: true}, avroOrderSchema)
	if err != nil {
		t.Fatal(err)
	}
	valid = func(i int) *kgo.Record {
		b, err := c.Encode(context.Background(), "", avroOrder{ID: fmt.Sprintf("o-%d", i)})
		if err != nil {
			panic(err)
		}
		return &kgo.Record{Value: b}
	}
	undecodable = func() *kgo.Record { return &kgo.Record{Value: []byte{1, 0, 0, 0, 1, 'x'}} }
	return c, valid, undecodable
}

// The test kit's DB-scope table holds with a typed handler whose records
// are Avro through a schema registry.
func TestKitDBScopeTyped(t *testing.T) {
	c, valid, undecodable := avroOrders(t)
	rep := kscopetest.DB(t, kscopetest.DBPipeline{
		Handler: dbscope.Typed(c, func(ctx context.Context, tx pgx.Tx, _ *consumer.Record, o avroOrder) error {
			_, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, o.ID)
			return err
		}),
		Schema:      `CREATE TABLE orders (id text)`,
		Valid:       valid,
		Undecodable: undecodable,
		Effects: func(ctx context.Context, db *pgxpool.Pool) (n int, err error) {
			err = db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
			return n, err
		},
	})
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
}

// The test kit's Kafka-scope table holds with a typed handler whose
// inputs and outputs are Avro through a schema registry.
func TestKitKafkaScopeTyped(t *testing.T) {
	c, valid, undecodable := avroOrders(t)
	rep := kscopetest.Kafka(t, kscopetest.KafkaPipeline{
		Handler: txn.Typed(c, func(ctx context.Context, r *consumer.Record, o avroOrder, out txn.Emitter) error {
			return txn.EmitValue(ctx, out, c, "orders.accepted", r.Key, o)
		}),
		OutputTopics:    []string{"orders.accepted"},
		OutputsPerInput: 1,
		Valid:           valid,
		Undecodable:     undecodable,
	})
	if !rep.Held() {
		t.Fatalf("%+v", rep)
	}
}
