package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kscope-dev/kscope/outbox"
	"github.com/kscope-dev/kscope/retrytopic"
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
Partitions wrote them, and no relay of this outbox publishes them. When
the position topic does not exist, no relay of the outbox has run yet (or
--outbox or --position-topic is not the relay's): every row is pending,
and it says so ("never_relayed" in --json). It changes nothing.
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
			to := timeoutFlags(fs)
			return func(ctx context.Context) error {
				kc, err := e.kafka(*brokers, to)
				if err != nil {
					return err
				}
				db, err := e.database(*dbURL, to)
				if err != nil {
					return err
				}
				defer db.Close()
				o := outbox.Options{Brokers: kc.brokers, ClientOptions: kc.opts(), Pool: db.Pool, Outbox: *name, Partitions: *parts,
					TablePrefix: *prefix, PositionTopic: *posTopic}
				st, err := outboxStatus(ctx, kc, db, o)
				if err != nil {
					return err
				}
				return printOutboxStatus(e, o, st, *asJSON)
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

// outboxStatus runs outbox.Status within --request-timeout and says
// which server did not answer.
func outboxStatus(ctx context.Context, kc *kafkaConn, db *dbConn, o outbox.Options) ([]outbox.PartitionStatus, error) {
	deadline := time.Now().Add(kc.to.request)
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	st, err := outbox.Status(rctx, o)
	var ce *pgconn.ConnectError
	var pe *pgconn.PgError
	var op *net.OpError
	switch {
	case err == nil || ctx.Err() != nil:
		return st, err
	case errors.As(err, &ce) || errors.As(err, &pe) || pgconn.Timeout(err):
		return nil, db.explain(ctx, err)
	case !time.Now().Before(deadline):
		return nil, kc.silent(err)
	case isTimeout(err) || errors.As(err, &op):
		return nil, kc.reachErr(err)
	}
	return nil, err
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
	// NeverRelayed says that the position topic does not exist: no relay
	// of this outbox has run yet (or --outbox or --position-topic is not
	// the relay's).
	NeverRelayed bool `json:"never_relayed,omitempty"`
}

func printOutboxStatus(e *env, o outbox.Options, st []outbox.PartitionStatus, asJSON bool) error {
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
			if err := enc.Encode(outboxEntry{Partition: s.Partition, Position: s.Position, Pending: s.Pending, OldestSeconds: age(s).Seconds(), Dead: s.Dead,
				Stranded: s.Stranded, NeverRelayed: s.NeverRelayed}); err != nil {
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
	if len(st) > 0 && st[0].NeverRelayed {
		fmt.Fprintf(e.stdout, "no relay of outbox %s has run yet: its position topic %s does not exist (a relay creates it when it starts). "+
			"Start an outbox.Relay for it, or check --outbox and --position-topic if one runs\n", o.Outbox, positionTopic(o))
	}
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

// positionTopic is o's position topic, defaulted as outbox.Options does.
func positionTopic(o outbox.Options) string {
	if o.PositionTopic != "" {
		return o.PositionTopic
	}
	return "kscope-outbox-" + retrytopic.SafeName(o.Outbox) + ".positions"
}
