package txn

import (
	"context"
	"slices"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/commit"
)

// The committed state of each assigned partition, as the last committed
// transaction recorded it: the offset and, in its metadata, the records
// done above it (commit.Done). A poll's records that it says are done are
// not handled again; a transaction commits, for each partition, what its
// watermark allows past it; an abort rewinds each partition to it.

// txnPart is what the last committed transaction recorded for one
// partition ([commit.Done]); it outlives the partition's assignments when
// an aborted transaction rewinds them. known is false until an offset was
// fetched for the partition or a record delivered.
type txnPart struct {
	mu    sync.Mutex
	known bool
	done  commit.Done
}

func (t *txnPart) get() (commit.Done, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.done, t.known
}

func (t *txnPart) set(d commit.Done) {
	t.mu.Lock()
	t.known, t.done = true, d
	t.mu.Unlock()
}

// setFirst makes offset the committed state of a partition that had none
// (nothing committed: its first record is where an abort rewinds to).
func (t *txnPart) setFirst(offset int64) {
	t.mu.Lock()
	if !t.known {
		t.known, t.done = true, commit.Done{Offset: offset, End: offset}
	}
	t.mu.Unlock()
}

// committedParts holds the committed state of each assigned partition:
// created when a partition is assigned (before its offset is fetched),
// dropped when its assignment ends.
type committedParts struct {
	mu    sync.Mutex
	parts map[tp]*txnPart
}

func (c *committedParts) of(topic string, p int32) *txnPart {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.parts[tp{topic, p}]
}

// assigning starts the committed state of newly assigned partitions: not
// known until their offsets are fetched.
func (c *committedParts) assigning(ps map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.parts == nil {
		c.parts = map[tp]*txnPart{}
	}
	for topic, parts := range ps {
		for _, p := range parts {
			c.parts[tp{topic, p}] = &txnPart{}
		}
	}
}

// inputs returns the assigned partitions of the topics in topics.
func (c *committedParts) inputs(topics []string) []tp {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []tp
	for k := range c.parts {
		if slices.Contains(topics, k.topic) {
			out = append(out, k)
		}
	}
	return out
}

// gone drops the committed state of partitions whose assignment ended.
func (c *committedParts) gone(ps map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, parts := range ps {
		for _, p := range parts {
			delete(c.parts, tp{topic, p})
		}
	}
}

// prior returns the committed state of a partition, for
// scope.TxnEngine.Progress and Rewind.
func (c *committedParts) prior(topic string, p int32) (commit.Done, bool) {
	if part := c.of(topic, p); part != nil {
		return part.get()
	}
	return commit.Done{}, false
}

// offset returns the offset a rewind fetches a partition from.
func (c *committedParts) offset(topic string, p int32) (int64, bool) {
	d, ok := c.prior(topic, p)
	return d.Offset, ok
}

// skip implements scope.Transactor's TxnSkip: it returns the records to
// dispatch among a poll's records of a partition, and the offsets of those
// its committed state says are done (their outputs committed before a
// crash, a rebalance or an abort).
func (c *committedParts) skip(topic string, p int32, recs []*kgo.Record) (keep []*kgo.Record, done []int64) {
	part := c.of(topic, p)
	if part == nil {
		return recs, nil // not assigned any more: the runner drops them
	}
	part.setFirst(recs[0].Offset)
	prior, _ := part.get()
	if recs[0].Offset >= prior.End {
		return recs, nil // the common case: past everything the state knows
	}
	keep = recs[:0:0]
	for _, rec := range recs {
		if prior.IsDone(rec.Offset) {
			done = append(done, rec.Offset)
			continue
		}
		keep = append(keep, rec)
	}
	return keep, done
}

// fetched installs, for partitions just assigned, the state their last
// transaction committed (the offset and, in its metadata, the records
// done above it), and returns the partitions whose offsets were fetched.
func (s *kafkaScope) fetched(resp *kmsg.OffsetFetchResponse) map[string][]int32 {
	ps := map[string][]int32{}
	for _, g := range resp.Groups {
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 {
					continue
				}
				part := s.states.of(t.Topic, p.Partition)
				if part == nil {
					continue
				}
				ps[t.Topic] = append(ps[t.Topic], p.Partition)
				if p.Offset < 0 {
					continue // nothing committed: known at the first record
				}
				meta := ""
				if p.Metadata != nil {
					meta = *p.Metadata
				}
				d, err := commit.ParseDone(p.Offset, meta)
				if err != nil {
					s.log.Warn("kscope: the committed offset's metadata is not what kscope wrote for it; records above the offset are handled again",
						"topic", t.Topic, "partition", p.Partition, "offset", p.Offset, "err", err)
				}
				part.set(d)
			}
		}
	}
	return ps
}

// onOffsetsFetched is the client's hook for the group's committed offsets
// of newly assigned partitions: it installs their committed state, and
// the versions of those partitions are restored before their records are
// handled.
func (s *kafkaScope) onOffsetsFetched(_ context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
	if ps := s.fetched(resp); len(ps) > 0 && s.vs != nil {
		s.vs.assigned(ps)
	}
	return nil
}

// txnPoint is what one partition commits in a transaction.
type txnPoint struct {
	part *txnPart
	done commit.Done
}

// txnOffsets returns the context that ends a transaction: it commits, for
// every assigned partition whose state moved, the offset at its lowest
// unfinished record with, in the metadata, the finished records above it;
// and those states, to install once the transaction committed.
func (s *kafkaScope) txnOffsets(ctx context.Context) (context.Context, map[tp]txnPoint) {
	points := map[tp]txnPoint{}
	for _, pd := range s.e.Progress(s.states.prior) {
		if part := s.states.of(pd.Topic, pd.Partition); part != nil {
			points[tp{pd.Topic, pd.Partition}] = txnPoint{part, pd.Done}
		}
	}
	return kgo.PreTxnCommitFnContext(ctx, func(req *kmsg.TxnOffsetCommitRequest) error {
		setTxnOffsets(req, points)
		return nil
	}), points
}

// setTxnOffsets makes req commit exactly points: the session's own offsets
// (the head of what was polled, which may lie past unfinished records) are
// replaced.
func setTxnOffsets(req *kmsg.TxnOffsetCommitRequest, points map[tp]txnPoint) {
	seen := map[tp]bool{}
	topics := req.Topics[:0]
	for _, t := range req.Topics {
		parts := t.Partitions[:0]
		for _, rp := range t.Partitions {
			k := tp{t.Topic, rp.Partition}
			pt, ok := points[k]
			if !ok {
				continue
			}
			seen[k] = true
			rp.Offset, rp.LeaderEpoch, rp.Metadata = pt.done.Offset, -1, kmsg.StringPtr(pt.done.Metadata())
			parts = append(parts, rp)
		}
		if len(parts) > 0 {
			t.Partitions = parts
			topics = append(topics, t)
		}
	}
	req.Topics = topics
	for k, pt := range points {
		if seen[k] {
			continue
		}
		i := slices.IndexFunc(req.Topics, func(t kmsg.TxnOffsetCommitRequestTopic) bool { return t.Topic == k.topic })
		if i < 0 {
			t := kmsg.NewTxnOffsetCommitRequestTopic()
			t.Topic = k.topic
			req.Topics = append(req.Topics, t)
			i = len(req.Topics) - 1
		}
		rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = k.partition, pt.done.Offset, -1, kmsg.StringPtr(pt.done.Metadata())
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
	}
}
