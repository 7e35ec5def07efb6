package outbox

import (
	"context"
	"fmt"
	"time"
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
	rows, err := r.o.Pool.Query(ctx, `SELECT partition, count(*) FROM `+r.o.TablePrefix+`outbox
		WHERE outbox = $1 AND (partition >= $2 OR partition < 0) GROUP BY partition ORDER BY partition`, r.o.Outbox, int32(r.o.Partitions))
	if err != nil {
		return 0, "", err
	}
	defer rows.Close()
	var total int64
	var parts string
	for rows.Next() {
		var p int32
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			return 0, "", err
		}
		total += n
		if parts != "" {
			parts += ", "
		}
		parts += fmt.Sprintf("%d (%d rows)", p, n)
	}
	return total, parts, rows.Err()
}
