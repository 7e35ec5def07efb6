package main

import (
	"context"
	"fmt"
	"regexp"
	"slices"

	"github.com/jackc/pgx/v5"
)

// inboxBatch is how many identities one inbox query looks up.
const inboxBatch = 1000

// noOpRate is how many of the records a replay would give a DB-scope
// consumer again are in its inbox already: their first outcome stands, so
// the replay is a no-op for them.
type noOpRate struct {
	// Consumer is the inbox's consumer name (dbscope.Options.Consumer).
	Consumer string `json:"inbox_consumer"`
	// Records are the records read; Identities their distinct identities.
	Records    int64 `json:"records"`
	Identities int   `json:"identities"`
	// InInbox are the records whose identity has an inbox row, Applied
	// those whose row says applied (the others were parked, retried or
	// dead-lettered: a replay does not run them again either).
	InInbox int64 `json:"records_in_inbox"`
	Applied int64 `json:"records_applied"`
	// Percent is InInbox out of Records, in percent.
	Percent float64 `json:"percent"`
	// LowerBound says that --max-scan stopped the read.
	LowerBound bool `json:"lower_bound,omitempty"`
}

func (n *noOpRate) String() string {
	s := fmt.Sprintf("%s (%d of %s read are in the inbox of consumer %s, %d of them applied: replaying them is a no-op",
		percent(n.Percent), n.InInbox, plural64(n.Records, "record"), n.Consumer, n.Applied)
	if n.LowerBound {
		s += "; of the records read up to --max-scan"
	}
	return s + ")"
}

// prefixRE is what a table prefix may be: it is written into the queries.
var prefixRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// lookUpInbox looks the identities the blast radius kept up in the inbox
// of consumer, inboxBatch at a time, and returns the no-op rate.
func lookUpInbox(ctx context.Context, db *dbConn, prefix, consumer string, b *blastRadius) (*noOpRate, error) {
	if prefix == "" {
		prefix = "kscope_"
	}
	if !prefixRE.MatchString(prefix) {
		return nil, usagef("--table-prefix %q is not a table prefix: letters, digits and _, not starting with a digit", prefix)
	}
	table := pgx.Identifier{prefix + "inbox"}.Sanitize()
	ids := make([]string, 0, len(b.ids))
	for id := range b.ids {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	n := &noOpRate{Consumer: consumer, Records: b.Records, Identities: len(ids), LowerBound: b.LowerBounds}
	for start := 0; start < len(ids); start += inboxBatch {
		batch := ids[start:min(start+inboxBatch, len(ids))]
		err := db.request(ctx, func(ctx context.Context) error {
			rows, err := db.Query(ctx, `SELECT message_id, status FROM `+table+` WHERE consumer = $1 AND message_id = ANY($2)`, consumer, batch)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var id, status string
				if err := rows.Scan(&id, &status); err != nil {
					return err
				}
				n.InInbox += b.ids[id]
				if status == "applied" {
					n.Applied += b.ids[id]
				}
			}
			return rows.Err()
		})
		if err != nil {
			return nil, fmt.Errorf("looking the records up in the inbox %s: %w", table, err)
		}
	}
	if n.Records > 0 {
		n.Percent = 100 * float64(n.InInbox) / float64(n.Records)
	}
	return n, nil
}
