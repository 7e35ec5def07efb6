package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/kscope-dev/kscope/codec"
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/devenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// report is what a run found, printed as one JSON line.
type report struct {
	OK            bool   `json:"ok"`
	Orders        int    `json:"orders"`         // rows in the orders table
	Events        int    `json:"events"`         // rows in the order_events table
	Duplicates    int    `json:"duplicates"`     // order ids or events written twice
	Lost          int    `json:"lost"`           // good records without their row
	OrdersDLT     int    `json:"orders_dlt"`     // poison payloads dead-lettered
	UpdatesDLT    int    `json:"updates_dlt"`    // unrouted events dead-lettered
	DecodeHeaders int    `json:"decode_headers"` // dead letters that carry the decode headers
	Kafka         string `json:"kafka"`
	Postgres      string `json:"postgres"`
}

// env is what a run runs against.
type env struct {
	kafka    *devenv.Kafka
	pool     *pgxpool.Pool
	registry *sr.Client
	cl       *kgo.Client
	names    names
	pgKind   string
}

// names are a run's topics and groups.
type names struct{ placed, updates, ordersGroup, updatesGroup string }

func run(ctx context.Context, log *slog.Logger, w workload) (report, error) {
	e, closeEnv, err := start(ctx)
	if err != nil {
		return report{}, err
	}
	defer closeEnv()
	orders, err := codec.RegistryAvro[Order](codec.Registry{Client: e.registry, AutoRegister: true}, orderSchema)
	if err != nil {
		return report{}, err
	}
	want, err := w.produce(ctx, e, orders)
	if err != nil {
		return report{}, err
	}
	base := consumer.Config{Brokers: e.kafka.Brokers, Shards: 8, Logger: log}
	oc := base
	oc.Group, oc.Topics = e.names.ordersGroup, []string{e.names.placed}
	ordersRunner, err := newOrders(oc, e.pool, orders)
	if err != nil {
		return report{}, err
	}
	uc := base
	uc.Group, uc.Topics = e.names.updatesGroup, []string{e.names.updates}
	updatesRunner, err := newUpdates(uc, e.pool, log)
	if err != nil {
		return report{}, err
	}
	if err := runUntil(ctx, want, ordersRunner, updatesRunner); err != nil {
		return report{}, err
	}
	return check(ctx, e, want)
}

// runUntil runs the two consumers until every record was handled or
// dead-lettered (or a minute passed), then stops them: they drain and
// commit.
func runUntil(ctx context.Context, want expected, ordersRunner, updatesRunner *dbscope.Runner) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	for _, r := range []*dbscope.Runner{ordersRunner, updatesRunner} {
		go func() { errs <- r.Run(runCtx) }()
	}
	finished := func() bool {
		o, u := ordersRunner.Stats(), updatesRunner.Stats()
		return o.DB.Applied >= int64(want.orders) && o.Failures.DeadLettered >= int64(want.poison) &&
			u.DB.Applied >= int64(want.events) && u.Failures.DeadLettered >= int64(want.unrouted)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for !finished() {
		select {
		case err := <-errs:
			return fmt.Errorf("a consumer stopped: %v", err)
		case <-deadline:
			return errors.New("not every record was handled within a minute")
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	cancel()
	return errors.Join(<-errs, <-errs)
}

// start starts (or connects to) Kafka, PostgreSQL and the schema registry,
// and creates the run's topics and tables.
func start(ctx context.Context) (*env, func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	e, err := startEnv(ctx, &closers)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return e, closeAll, nil
}

func startEnv(ctx context.Context, closers *[]func()) (*env, error) {
	e := &env{names: names{
		placed: devenv.RunName("orders.placed"), updates: devenv.RunName("orders.updates"),
		ordersGroup: devenv.RunName("orders"), updatesGroup: devenv.RunName("order-updates"),
	}}
	kafka, err := devenv.StartKafka(ctx)
	if err != nil {
		return nil, err
	}
	e.kafka = kafka
	*closers = append(*closers, kafka.Close, func() {
		kafka.Remove(context.WithoutCancel(ctx), e.names.ordersGroup, e.names.placed)   //nolint:errcheck // best effort
		kafka.Remove(context.WithoutCancel(ctx), e.names.updatesGroup, e.names.updates) //nolint:errcheck // best effort
	})
	if e.registry, err = registry(closers); err != nil {
		return nil, err
	}
	if err := e.startPostgres(ctx, closers); err != nil {
		return nil, err
	}
	if e.cl, err = kgo.NewClient(kgo.SeedBrokers(kafka.Brokers...)); err != nil {
		return nil, err
	}
	*closers = append(*closers, e.cl.Close)
	if _, err := kadm.NewClient(e.cl).CreateTopics(ctx, 4, -1, nil, e.names.placed, e.names.updates); err != nil {
		return nil, fmt.Errorf("creating the topics: %w", err)
	}
	return e, nil
}

// registry returns a client of SCHEMA_REGISTRY_URL, or of an in-process
// registry started for the run.
func registry(closers *[]func()) (*sr.Client, error) {
	url := os.Getenv("SCHEMA_REGISTRY_URL")
	if url == "" {
		reg := srfake.New()
		*closers = append(*closers, reg.Close)
		url = reg.URL()
	}
	return sr.NewClient(sr.URLs(url))
}

// startPostgres connects to a schema of the run's own, with kscope's
// tables and the example's.
func (e *env) startPostgres(ctx context.Context, closers *[]func()) error {
	pg, err := devenv.StartPostgres(ctx)
	if err != nil {
		return err
	}
	*closers = append(*closers, pg.Close)
	e.pgKind = pg.Kind
	url, drop, err := pg.Schema(ctx, devenv.RunName("orders"))
	if err != nil {
		return err
	}
	*closers = append(*closers, func() { drop(context.WithoutCancel(ctx)) }) //nolint:errcheck // best effort
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 20 // both consumers' key-shards
	if e.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return err
	}
	*closers = append(*closers, e.pool.Close)
	if err := dbscope.Migrate(ctx, e.pool, ""); err != nil {
		return err
	}
	_, err = e.pool.Exec(ctx, schemaSQL)
	return err
}

// dltName is the dead-letter topic of group.
func dltName(group string) string { return retrytopic.DLTopic(group) }
