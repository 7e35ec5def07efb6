package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/kread"
)

// PartitionStatus is where one outbox partition stands.
type PartitionStatus struct {
	Partition int
	// Position is the last sequence number a committed relay transaction
	// published (0: none yet).
	Position int64
	// Pending counts the committed rows after Position, not published
	// yet; Oldest is when the oldest of them was written (zero when none).
	Pending int64
	Oldest  time.Time
	// Dead counts the partition's rows in the dead-letter table: rows
	// Kafka refuses for good, not published until an operator requeues
	// them (see DeadLetters).
	Dead int64
	// Stranded is set for a partition outside 0 to Partitions-1 that
	// holds rows: a Writer with another Partitions wrote them, and no
	// relay of this outbox publishes them (Position is 0, Pending counts
	// them all). Status lists such partitions after the relay's.
	Stranded bool
	// NeverRelayed is set on every partition when the position topic
	// does not exist: no relay of this outbox (with this PositionTopic)
	// has ever run, so Pending counts every row. It is also what a wrong
	// Outbox or PositionTopic looks like.
	NeverRelayed bool
}

// Status reads where every partition of the outbox o names stands: the
// relay's position from the position topic (read_committed), and the rows
// not published yet and those in the dead-letter table from the database.
// Partitions outside 0 to o.Partitions-1 that hold rows follow, marked
// Stranded: rows a Writer with another Partitions wrote.
// o needs Brokers, Pool and the names (Outbox, Partitions, TablePrefix,
// PositionTopic) the relay uses.
func Status(ctx context.Context, o Options) ([]PartitionStatus, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	parts := make([]int, o.Partitions)
	for i := range parts {
		parts[i] = i
	}
	pos, relayed, err := statusPositions(ctx, o, parts)
	if err != nil {
		return nil, fmt.Errorf("kscope: outbox status: reading the positions from %s: %w", o.PositionTopic, err)
	}
	st, err := pending(ctx, o.Pool, o, pos)
	for i := range st {
		st[i].NeverRelayed = !relayed
	}
	return st, err
}

// pending counts, for every partition of the outbox, the rows after its
// position.
func pending(ctx context.Context, pool *pgxpool.Pool, o Options, pos map[int]int64) ([]PartitionStatus, error) {
	all := make(map[int]int64, o.Partitions)
	for p := range o.Partitions {
		all[p] = pos[p]
	}
	o.Pool = pool
	stranded, err := strandedCounts(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("kscope: outbox status: looking for rows outside the outbox's partitions: %w", err)
	}
	for _, c := range stranded {
		all[int(c.partition)] = 0
	}
	st, err := pendingOf(ctx, o, all)
	if err != nil {
		return nil, err
	}
	for i := range st {
		st[i].Stranded = st[i].Partition < 0 || st[i].Partition >= o.Partitions
	}
	// pendingOf lists partitions in order, stranded negative ones first:
	// the relay's go first.
	slices.SortStableFunc(st, func(a, b PartitionStatus) int {
		switch {
		case a.Stranded == b.Stranded:
			return 0
		case b.Stranded:
			return -1
		}
		return 1
	})
	return st, nil
}

// pendingOf counts, for each partition of pos, the rows after its
// position and the rows in the dead-letter table, in partition order.
func pendingOf(ctx context.Context, o Options, pos map[int]int64) ([]PartitionStatus, error) {
	parts := make([]int, 0, len(pos))
	for p := range pos {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	out := make([]PartitionStatus, len(parts))
	idx := make(map[int32]int, len(parts))
	ps, ss := make([]int32, len(parts)), make([]int64, len(parts))
	for i, p := range parts {
		out[i] = PartitionStatus{Partition: p, Position: pos[p]}
		ps[i], ss[i] = int32(p), pos[p]
		idx[int32(p)] = i
	}
	rows, err := o.Pool.Query(ctx, `SELECT o.partition, count(*), min(o.created_at) FROM `+o.TablePrefix+`outbox AS o
		JOIN unnest($2::int[], $3::bigint[]) AS x(part, pos) ON o.partition = x.part
		WHERE o.outbox = $1 AND o.seq > x.pos GROUP BY 1`, o.Outbox, ps, ss)
	if err != nil {
		return nil, fmt.Errorf("kscope: outbox status: counting pending rows: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var p int32
		var n int64
		var oldest time.Time
		if err := rows.Scan(&p, &n, &oldest); err != nil {
			return nil, err
		}
		if i, ok := idx[p]; ok {
			out[i].Pending, out[i].Oldest = n, oldest
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows.Close()
	rows, err = o.Pool.Query(ctx, `SELECT partition, count(*) FROM `+o.TablePrefix+`outbox_dead
		WHERE outbox = $1 AND partition = ANY($2) GROUP BY 1`, o.Outbox, ps)
	if err != nil {
		return nil, fmt.Errorf("kscope: outbox status: counting dead-letter rows: %w", schemaErr(ctx, o.Pool, o.TablePrefix, err))
	}
	defer rows.Close()
	for rows.Next() {
		var p int32
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			return nil, err
		}
		if i, ok := idx[p]; ok {
			out[i].Dead = n
		}
	}
	return out, rows.Err()
}

// statusPositions is readPositions for Status: exists is false, and every
// position 0, when the position topic does not exist (no relay has run).
func statusPositions(ctx context.Context, o Options, parts []int) (pos map[int]int64, exists bool, err error) {
	pos, err = readPositions(ctx, o, parts)
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		pos = make(map[int]int64, len(parts))
		for _, p := range parts {
			pos[p] = 0
		}
		return pos, false, nil
	}
	return pos, err == nil, err
}

// readPositions reads the last committed position of each of parts from
// the position topic: it reads, read_committed, every partition to the end
// offset it has when called. A caller that publishes the partition has
// initialised its producer first, so no transaction of an earlier
// producer is left open on it.
func readPositions(ctx context.Context, o Options, parts []int) (map[int]int64, error) {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, o.ClientOptions...), kgo.SeedBrokers(o.Brokers...))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, o.PositionTopic)
	if err != nil {
		return nil, err
	}
	if err := ends.Error(); err != nil {
		return nil, err
	}
	pos := make(map[int]int64, len(parts))
	left := map[int32]int64{}
	from := map[int32]kgo.Offset{}
	for _, p := range parts {
		pos[p] = 0
		e, ok := ends.Lookup(o.PositionTopic, int32(p))
		if !ok {
			return nil, fmt.Errorf("the position topic has no partition %d; it needs %d partitions", p, o.Partitions)
		}
		if e.Offset > 0 {
			left[int32(p)] = e.Offset
			from[int32(p)] = kgo.NewOffset().AtStart()
		}
	}
	if len(left) == 0 {
		return pos, nil
	}
	rd, err := kgo.NewClient(append(append([]kgo.Opt{}, o.ClientOptions...),
		kgo.SeedBrokers(o.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{o.PositionTopic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	err = kread.ToEnd(ctx, rd, map[string]map[int32]int64{o.PositionTopic: left}, kread.Options{}, func(rec *kgo.Record) error {
		if v, err := strconv.ParseInt(string(rec.Value), 10, 64); err == nil {
			pos[int(rec.Partition)] = v
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return pos, nil
}
