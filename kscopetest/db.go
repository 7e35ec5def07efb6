package kscopetest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
)

// DBPipeline describes a service's DB-scope pipeline to the kit.
type DBPipeline struct {
	// Handler is the service's handler, unchanged.
	Handler dbscope.Handler
	// BatchHandler, instead of Handler, is the service's batch handler
	// (dbscope.NewBatch), unchanged. The records of a call whose
	// transaction rolls back for another record's failure are called
	// again by design; the kit does not count that as a repeat.
	BatchHandler dbscope.BatchHandler
	// Schema creates the service's tables (run after dbscope.Migrate).
	Schema string
	// Options are the service's DB-scope options; the kit sets Pool.
	Options dbscope.Options
	// Config, when not nil, adjusts the consumer configuration the kit
	// builds (brokers, group and topic are the kit's).
	Config func(consumer.Config) consumer.Config
	// Valid returns the i-th well-formed input record (value and any
	// headers; the kit sets topic, key and message id).
	Valid func(i int) *kgo.Record
	// Undecodable returns a record the handler rejects as poison
	// (consumer.DecodeError). Nil skips that scenario.
	Undecodable func() *kgo.Record
	// Effects counts the effects in the database (rows the handler wrote).
	Effects func(ctx context.Context, db *pgxpool.Pool) (int, error)
}

// DB runs every scenario against p and returns the report; each failing
// scenario also fails its subtest of t.
func DB(t *testing.T, p DBPipeline) Report {
	t.Helper()
	return table(t, scenarios, func(t *testing.T) pipeline { return dbPipeline(t, p) })
}

// dbPipeline opens a fresh database for one scenario of p: kscope's
// tables (dbscope.Migrate) and the service's Schema.
func dbPipeline(t *testing.T, p DBPipeline) pipeline {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := dbscope.Migrate(ctx, pool, p.Options.TablePrefix); err != nil {
		t.Fatal(err)
	}
	if p.Schema != "" {
		if _, err := pool.Exec(ctx, p.Schema); err != nil {
			t.Fatalf("kscopetest: the pipeline's Schema: %v", err)
		}
	}
	return pipeline{
		valid: p.Valid, undecodable: p.Undecodable, config: p.Config,
		versions: p.Options.Versions, what: "dbscope.New",
		duplicates: func(st consumer.Stats) int64 { return st.DB.Duplicates },
		effects:    func(ctx context.Context) (int, error) { return p.Effects(ctx, pool) },
		build: func(cfg consumer.Config, f *Faults) (kitRunner, error) {
			o := p.Options
			o.Pool = pool
			if p.BatchHandler != nil {
				return dbBatch(cfg, o, p.BatchHandler, f)
			}
			r, err := dbscope.New(cfg, o, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
				return f.Call(r, func() error { return p.Handler.Handle(ctx, tx, r) })
			}))
			if err != nil {
				return nil, err
			}
			return r, nil
		},
	}
}
