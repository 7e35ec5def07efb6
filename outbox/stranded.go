package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// strandedEvery is how often a relay looks for rows no relay of its
// Partitions publishes.
var strandedEvery = time.Minute

// watchStranded looks, when the relay starts and every strandedEvery,
// for rows of its outbox in partitions outside 0 to Partitions-1: rows a
// Writer with another Partitions wrote (Writer.Partitions must be the
// Relay's). No relay of this outbox publishes them; they stay in the
// table, counted in Stats.Stranded and logged at ERROR with what to do,
// until an operator moves them. A Writer with fewer partitions than the
// relay writes rows the relay publishes, but a key's rows may then sit in
// two partitions, published side by side: only one Partitions everywhere
// keeps a key's order.
func (r *Relay) watchStranded(ctx context.Context) {
	t := time.NewTicker(strandedEvery)
	defer t.Stop()
	last := int64(-1)
	for {
		n, parts, err := r.stranded(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			r.log.Warn("kscope: outbox relay: could not look for rows outside the outbox's partitions", "err", err)
		case err == nil:
			r.strandedRows.Store(n)
			if n > 0 && n != last {
				r.log.Error("kscope: outbox relay: rows of this outbox sit in partitions no relay of it publishes: a Writer with another Partitions wrote them "+
					"(Writer.Partitions must be the relay's). Give every Writer the relay's Partitions; then republish these rows "+
					"(insert them again through a Writer, and delete them) or delete them",
					"rows", n, "partitions", parts, "relay_partitions", r.o.Partitions,
					"table", r.o.TablePrefix+"outbox")
			}
			last = n
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// stranded counts the outbox's rows outside partitions 0 to
// Partitions-1, and lists those partitions.
func (r *Relay) stranded(ctx context.Context) (int64, string, error) {
	counts, err := strandedCounts(ctx, r.o)
	if err != nil {
		return 0, "", err
	}
	var total int64
	var parts string
	for _, c := range counts {
		total += c.rows
		if parts != "" {
			parts += ", "
		}
		parts += fmt.Sprintf("%d (%d rows)", c.partition, c.rows)
	}
	return total, parts, nil
}

// partitionRows is a partition of an outbox and how many rows it holds.
type partitionRows struct {
	partition int32
	rows      int64
}

// strandedCounts counts the rows of outbox o.Outbox in each partition
// outside 0 to o.Partitions-1, in partition order: what the relay's watch
// reports and Status lists as stranded.
func strandedCounts(ctx context.Context, o Options) ([]partitionRows, error) {
	rows, err := o.Pool.Query(ctx, `SELECT partition, count(*) FROM `+o.TablePrefix+`outbox
		WHERE outbox = $1 AND (partition >= $2 OR partition < 0) GROUP BY partition ORDER BY partition`, o.Outbox, int32(o.Partitions))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (partitionRows, error) {
		var c partitionRows
		err := row.Scan(&c.partition, &c.rows)
		return c, err
	})
}
