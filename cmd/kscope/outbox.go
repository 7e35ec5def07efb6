package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/outbox"
)

func outboxStatusCmd() *command {
	return &command{
		name:    "outbox status",
		summary: "show an outbox's pending rows, their age and the relay's position per partition",
		usage: `
Usage:
  kscope outbox status [--outbox NAME] [--partitions N] [--database-url URL] [--json]

Reads, for every partition of an outbox, the relay's position (the last
sequence number a committed relay transaction published, from the position
topic, read_committed) and, from the database, how many committed rows are
not published yet and how old the oldest of them is. It changes nothing.
The names must be the relay's: --outbox, --partitions, --table-prefix and
--position-topic default as outbox.Options does.

Examples:
  kscope outbox status
  kscope outbox status --outbox payments --partitions 32 --json
`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			brokers := brokerFlag(fs)
			dbURL := fs.String("database-url", "", "the PostgreSQL connection string (default $DATABASE_URL)")
			name := fs.String("outbox", outbox.DefaultOutbox, "the outbox's name")
			parts := fs.Int("partitions", outbox.DefaultPartitions, "the outbox's partition count")
			prefix := fs.String("table-prefix", "", "the table prefix given to dbscope.Migrate (default kscope_)")
			posTopic := fs.String("position-topic", "", "the relay's position topic (default kscope-outbox-<outbox>.positions)")
			asJSON := fs.Bool("json", false, "print one JSON object per partition and line")
			return func(ctx context.Context) error {
				bs, err := e.brokers(*brokers)
				if err != nil {
					return err
				}
				url := *dbURL
				if strings.TrimSpace(url) == "" {
					url = e.getenv("DATABASE_URL")
				}
				if strings.TrimSpace(url) == "" {
					return usagef("no database given: set --database-url or DATABASE_URL")
				}
				pool, err := pgxpool.New(ctx, url)
				if err != nil {
					return fmt.Errorf("bad --database-url: %w", err)
				}
				defer pool.Close()
				st, err := outbox.Status(ctx, outbox.Options{Brokers: bs, Pool: pool, Outbox: *name, Partitions: *parts,
					TablePrefix: *prefix, PositionTopic: *posTopic})
				if err != nil {
					return err
				}
				return printOutboxStatus(e, st, *asJSON)
			}
		},
	}
}

// outboxEntry is one partition in outbox status --json.
type outboxEntry struct {
	Partition     int     `json:"partition"`
	Position      int64   `json:"position"`
	Pending       int64   `json:"pending"`
	OldestSeconds float64 `json:"oldest_pending_seconds"`
}

func printOutboxStatus(e *env, st []outbox.PartitionStatus, asJSON bool) error {
	now := time.Now()
	age := func(s outbox.PartitionStatus) time.Duration {
		if s.Oldest.IsZero() {
			return 0
		}
		return max(now.Sub(s.Oldest), 0)
	}
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		for _, s := range st {
			if err := enc.Encode(outboxEntry{Partition: s.Partition, Position: s.Position, Pending: s.Pending, OldestSeconds: age(s).Seconds()}); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tPOSITION\tPENDING\tOLDEST PENDING")
	var total int64
	var oldest time.Duration
	for _, s := range st {
		a := "-"
		if s.Pending > 0 {
			a = age(s).Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\n", s.Partition, s.Position, s.Pending, a)
		total += s.Pending
		oldest = max(oldest, age(s))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s pending, the oldest for %s\n", plural(int(total), "row"), oldest.Round(time.Millisecond))
	return nil
}
