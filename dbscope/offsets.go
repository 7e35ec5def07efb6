package dbscope

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/partition"
)

// adjustOffsets loads the stored positions of newly assigned partitions and
// moves the fetch start ahead of the committed Kafka offset when every shard
// has applied past it.
func (s *dbScope) adjustOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	for topic, parts := range offsets {
		ids := make([]int32, 0, len(parts))
		for p := range parts {
			ids = append(ids, p)
		}
		rows, err := s.o.Pool.Query(ctx, s.sqlLoadOffsets, s.o.Consumer, topic, s.routing, ids)
		if err != nil {
			return nil, fmt.Errorf("kscope: loading stored offsets of %s: %w", topic, err)
		}
		perPart := make(map[int32][]int64)
		s.marksMu.Lock()
		for rows.Next() {
			var p int32
			var shard int
			var next int64
			if err := rows.Scan(&p, &shard, &next); err != nil {
				rows.Close()
				s.marksMu.Unlock()
				return nil, err
			}
			s.marks[shardKey{topic, p, shard}] = next
			perPart[p] = append(perPart[p], next)
		}
		s.marksMu.Unlock()
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("kscope: loading stored offsets of %s: %w", topic, err)
		}
		for p, nexts := range perPart {
			if len(nexts) != s.shards {
				continue // a shard with no row may hold an unapplied record anywhere
			}
			resume := nexts[0]
			for _, n := range nexts[1:] {
				resume = min(resume, n)
			}
			if committed := parts[p].EpochOffset().Offset; committed < resume {
				parts[p] = kgo.NewOffset().At(resume)
				s.log.Info("kscope: resuming from the offset stored in the database", "topic", topic, "partition", p, "offset", resume, "kafka_committed", committed)
			}
		}
	}
	return offsets, nil
}

// routingOf names the routing of records to key-shards under shards and
// nullKeys: the shard count, the null-key policy, and a digest of the
// shards the routing hash gives a fixed set of records, which changes if
// the hash itself does. A stored position says which records routed to its
// shard are durable, so it holds only under the routing it was written
// under.
func routingOf(shards int, nullKeys consumer.NullKeyPolicy) string {
	h := fnv.New64a()
	th := partition.HashTopic("kscope-routing-probe")
	for p := range int32(4) {
		for off := range int64(8) {
			for k := range 9 {
				var key []byte
				if k > 0 {
					key = []byte{'k', byte(k), byte(off)}
				}
				binary.Write(h, binary.LittleEndian, int32(th.Shard(p, off, key, shards, nullKeys))) //nolint:errcheck // hashes do not fail
			}
		}
	}
	return fmt.Sprintf("shards=%d nullkeys=%s hash=%016x", shards, nullKeys, h.Sum64())
}

func (s *dbScope) mark(r *consumer.Record) (int64, bool) {
	s.marksMu.Lock()
	defer s.marksMu.Unlock()
	m, ok := s.marks[shardKey{r.Topic, r.Partition, s.eng.Shard(r)}]
	return m, ok
}
