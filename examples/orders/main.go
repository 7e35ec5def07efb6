// Command orders is a service that consumes two topics with kscope's DB
// scope, the way services write handlers:
//
//   - orders.placed carries Avro in the Confluent wire format, through a
//     schema registry. A batch handler decodes the records of one
//     transaction and writes their orders with one COPY; each record is
//     still applied exactly once, and a payload that does not decode (a
//     wrong magic byte, a schema id the registry does not have, a truncated
//     body) goes to the dead-letter topic with its raw bytes and its schema
//     id while the rest of its partition flows on.
//   - orders.updates carries JSON, told apart by an event-type header. A
//     router sends each record to the typed handler of its event type,
//     through a middleware chain (kscope's Recover and a log of slow
//     calls) under a handler timeout; an event type no route names goes to
//     the dead-letter topic.
//
// It produces a workload (orders with three poison payloads among them,
// and their events with one unknown event type per ten orders), runs both
// consumers until every record is handled, checks the tables and the
// dead-letter topics, prints a JSON report and exits non-zero when a
// record was lost or applied twice. With no KAFKA_BROKERS, DATABASE_URL or
// SCHEMA_REGISTRY_URL it starts an in-process Kafka (kfake), a throwaway
// PostgreSQL and an in-process registry (franz-go's srfake):
//
//	go run ./examples/orders
//
// Its topics, groups and schema get names of their own per run
// (devenv.RunName), so that it runs again and again against the same
// servers.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rep, err := run(ctx, log, workload{orders: 600, customers: 40})
	if err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
	b, _ := json.Marshal(rep)
	fmt.Println(string(b))
	if !rep.OK {
		os.Exit(1)
	}
}
