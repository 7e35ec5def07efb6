package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/kscopeotel"
	"github.com/kscope-dev/kscope/kscopeprom"
	"github.com/kscope-dev/kscope/outbox"
)

// startOutbox starts PostgreSQL, a relay whose metrics go to metrics, and
// writes the outboxed notifications in one transaction, inside a "book
// order" span: the tracer hook writes that span's context into each
// record, and the relay publishes it with them. It returns the relay and
// the writer's trace id. Everything stops with ctx.
func startOutbox(ctx context.Context, brokers []string, metrics *kscopeprom.Metrics, tp *sdktrace.TracerProvider, tracer *kscopeotel.Tracer) (*outbox.Relay, trace.TraceID, error) {
	var none trace.TraceID
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		return nil, none, err
	}
	context.AfterFunc(ctx, pg.Close)
	url, err := pg.NewDatabase(ctx, "observability")
	if err != nil {
		return nil, none, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, none, err
	}
	context.AfterFunc(ctx, pool.Close)
	if err := outbox.Migrate(ctx, pool, ""); err != nil {
		return nil, none, err
	}
	o := outbox.Options{Brokers: brokers, Pool: pool, Outbox: topic, Partitions: 3}
	relay, err := outbox.New(o)
	if err != nil {
		return nil, none, err
	}
	if err := metrics.WatchRelay(relay); err != nil {
		return nil, none, err
	}
	go relay.Run(ctx) //nolint:errcheck // stops with ctx

	w := outbox.Writer{Outbox: topic, Partitions: 3, Hooks: []consumer.Hook{tracer}}
	sctx, span := tp.Tracer("orders").Start(ctx, "book order")
	defer span.End()
	err = pgx.BeginFunc(sctx, pool, func(tx pgx.Tx) error {
		for i := range outboxed {
			rec := &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("user-%02d", i)), Value: []byte(fmt.Sprintf("email-outbox-%02d", i))}
			if _, err := w.Add(sctx, tx, rec); err != nil {
				return err
			}
		}
		return nil
	})
	return relay, span.SpanContext().TraceID(), err
}
