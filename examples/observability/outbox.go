package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kscope-dev/kscope/devenv"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/kscopeotel"
	"github.com/kscope-dev/kscope/kscopeprom"
	"github.com/kscope-dev/kscope/outbox"
)

// startOutbox starts PostgreSQL (or uses DATABASE_URL, in a schema of the
// run's own), a relay whose metrics go to metrics, and writes the outboxed
// notifications in one transaction, inside a "book order" span: the tracer
// hook writes that span's context into each record, and the relay
// publishes it with them. It returns the writer's trace id and the
// function that stops the relay and removes the schema and the server.
func startOutbox(ctx context.Context, brokers []string, metrics *kscopeprom.Metrics, tp *sdktrace.TracerProvider, tracer *kscopeotel.Tracer) (id trace.TraceID, stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	undo := []func(){cancel}
	stop = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	pg, err := devenv.StartPostgres(ctx)
	if err != nil {
		return id, stop, err
	}
	undo = append(undo, pg.Close)
	url, drop, err := pg.Schema(ctx, devenv.RunName("observability"))
	if err != nil {
		return id, stop, err
	}
	undo = append(undo, func() { drop(context.WithoutCancel(ctx)) }) //nolint:errcheck // best effort
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return id, stop, err
	}
	undo = append(undo, pool.Close)
	if err := outbox.Migrate(ctx, pool, ""); err != nil {
		return id, stop, err
	}
	o := outbox.Options{Brokers: brokers, Pool: pool, Outbox: topic, Partitions: 3}
	relay, err := outbox.New(o)
	if err != nil {
		return id, stop, err
	}
	if err := metrics.WatchRelay(relay); err != nil {
		return id, stop, err
	}
	relayDone := make(chan struct{})
	go func() {
		defer close(relayDone)
		relay.Run(ctx) //nolint:errcheck // stops with ctx
	}()
	undo = append(undo, func() { <-relayDone })

	w := outbox.Writer{Outbox: topic, Partitions: 3, Hooks: []hook.Hook{tracer}}
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
	return span.SpanContext().TraceID(), stop, err
}
