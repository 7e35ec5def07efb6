package dbscope_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/kscope-dev/kscope/codec"
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
)

// A typed DB-scope handler on Avro records in the Confluent wire format:
// the ledger row and the inbox row commit together, once per capture. A
// capture whose schema id the registry does not have, or whose bytes are
// not Avro, is dead-lettered with the schema id in its headers.
func ExampleTyped() {
	type Capture struct {
		Account string `avro:"account"`
		Cents   int64  `avro:"cents"`
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/payments")
	if err != nil {
		log.Fatal(err)
	}
	cl, err := sr.NewClient(sr.URLs("http://localhost:8081"))
	if err != nil {
		log.Fatal(err)
	}
	c, err := codec.RegistryAvro[Capture](codec.Registry{Client: cl},
		`{"type":"record","name":"Capture","fields":[{"name":"account","type":"string"},{"name":"cents","type":"long"}]}`)
	if err != nil {
		log.Fatal(err)
	}
	r, err := dbscope.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "ledger",
		Topics:  []string{"payments.captured"},
	}, dbscope.Options{Pool: pool}, dbscope.Typed(c, func(ctx context.Context, tx pgx.Tx, _ *consumer.Record, p Capture) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (account, cents) VALUES ($1, $2)`, p.Account, p.Cents)
		return err
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// The typed form of a QueueHandler.
func ExampleTypedQueue() {
	type Capture struct {
		Account string `json:"account"`
		Cents   int64  `json:"cents"`
	}
	h := dbscope.TypedQueue(codec.JSON[Capture](), func(_ context.Context, q *dbscope.Queue, _ *consumer.Record, p Capture) error {
		q.Exec(`INSERT INTO ledger (account, cents) VALUES ($1, $2)`, p.Account, p.Cents)
		return nil
	})
	_ = h // dbscope.NewQueued(cfg, opts, h)
}
