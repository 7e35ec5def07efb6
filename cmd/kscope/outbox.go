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
		summary: "show an outbox's pending rows, their age, its dead rows and the relay's position per partition",
		usage: `
Usage:
  kscope outbox status [--outbox NAME] [--partitions N] [--database-url URL] [--json]

Reads, for every partition of an outbox, the relay's position (the last
sequence number a committed relay transaction published, from the position
topic, read_committed) and, from the database, how many committed rows are
not published yet, how old the oldest of them is, and how many rows the
relay moved to the dead-letter table because Kafka refuses them (see them
with 'kscope outbox dead list'). Partitions outside 0 to --partitions - 1
that hold rows are listed last, as "no relay": a Writer with another
Partitions wrote them, and no relay of this outbox publishes them. It
changes nothing.
The names must be the relay's: --outbox, --partitions, --table-prefix and
--position-topic default as outbox.Options does.

Examples:
  kscope outbox status
  kscope outbox status --outbox payments --partitions 32 --json
`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			brokers := brokerFlag(fs)
			dbURL := databaseFlag(fs)
			name := fs.String("outbox", outbox.DefaultOutbox, "the outbox's name")
			parts := fs.Int("partitions", outbox.DefaultPartitions, "the outbox's partition count")
			prefix := tablePrefixFlag(fs)
			posTopic := fs.String("position-topic", "", "the relay's position topic (default kscope-outbox-<outbox>.positions)")
			asJSON := fs.Bool("json", false, "print one JSON object per partition and line")
			return func(ctx context.Context) error {
				bs, err := e.brokers(*brokers)
				if err != nil {
					return err
				}
				pool, err := e.database(ctx, *dbURL)
				if err != nil {
					return err
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

// databaseFlag declares --database-url.
func databaseFlag(fs *flag.FlagSet) *string {
	return fs.String("database-url", "", "the PostgreSQL connection string (default $DATABASE_URL)")
}

// tablePrefixFlag declares --table-prefix.
func tablePrefixFlag(fs *flag.FlagSet) *string {
	return fs.String("table-prefix", "", "the table prefix given to dbscope.Migrate (default kscope_)")
}

// database returns a pool on the database of the flag or DATABASE_URL.
func (e *env) database(ctx context.Context, flagValue string) (*pgxpool.Pool, error) {
	url := flagValue
	if strings.TrimSpace(url) == "" {
		url = e.getenv("DATABASE_URL")
	}
	if strings.TrimSpace(url) == "" {
		return nil, usagef("no database given: set --database-url or DATABASE_URL")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("bad --database-url: %w", err)
	}
	return pool, nil
}

// outboxEntry is one partition in outbox status --json.
type outboxEntry struct {
	Partition     int     `json:"partition"`
	Position      int64   `json:"position"`
	Pending       int64   `json:"pending"`
	OldestSeconds float64 `json:"oldest_pending_seconds"`
	Dead          int64   `json:"dead"`
	// Stranded marks a partition outside the outbox's --partitions that
	// holds rows: no relay of that many partitions publishes them.
	Stranded bool `json:"stranded,omitempty"`
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
			if err := enc.Encode(outboxEntry{Partition: s.Partition, Position: s.Position, Pending: s.Pending, OldestSeconds: age(s).Seconds(), Dead: s.Dead, Stranded: s.Stranded}); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tPOSITION\tPENDING\tOLDEST PENDING\tDEAD")
	var total, dead, stranded int64
	var strandedParts []string
	var oldest time.Duration
	for _, s := range st {
		a := "-"
		if s.Pending > 0 {
			a = age(s).Round(time.Millisecond).String()
		}
		pos := fmt.Sprint(s.Position)
		if s.Stranded {
			pos = "no relay"
			stranded += s.Pending
			strandedParts = append(strandedParts, fmt.Sprint(s.Partition))
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%d\n", s.Partition, pos, s.Pending, a, s.Dead)
		total += s.Pending
		dead += s.Dead
		oldest = max(oldest, age(s))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s pending, the oldest for %s\n", plural(int(total), "row"), oldest.Round(time.Millisecond))
	if dead > 0 {
		fmt.Fprintf(e.stdout, "%s in the dead-letter table, not published: Kafka refuses them; see 'kscope outbox dead list'\n", plural(int(dead), "row"))
	}
	if stranded > 0 {
		fmt.Fprintf(e.stdout, "%s in partitions %s, outside the outbox's %d: no relay of %d partitions publishes them. A Writer with another "+
			"Partitions wrote them (Writer.Partitions must be the relay's): give every Writer the relay's, then write these rows again "+
			"through a Writer and delete them, or delete them\n",
			plural(int(stranded), "row"), strings.Join(strandedParts, ", "), len(st)-len(strandedParts), len(st)-len(strandedParts))
	}
	return nil
}
