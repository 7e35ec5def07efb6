package commit

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

type tp struct {
	topic     string
	partition int32
}

// Tracker holds the [Partition] watermark of every partition currently
// assigned to one group member, and what was last committed for each.
type Tracker struct {
	mu        sync.Mutex
	parts     map[tp]*Partition
	committed map[tp]int64
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker {
	return &Tracker{parts: make(map[tp]*Partition), committed: make(map[tp]int64)}
}

// Assign starts tracking a new assignment of topic/partition and returns it.
// A previous assignment of the same partition, if any, is detached.
func (t *Tracker) Assign(topic string, partition int32) *Partition {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := tp{topic, partition}
	if old := t.parts[k]; old != nil {
		old.Detach()
	}
	p := NewPartition(topic, partition)
	t.parts[k] = p
	delete(t.committed, k)
	return p
}

// Get returns the current assignment of topic/partition, or nil.
func (t *Tracker) Get(topic string, partition int32) *Partition {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.parts[tp{topic, partition}]
}

// Remove stops tracking topic/partition and detaches its assignment, which it
// returns (nil when it was not tracked).
func (t *Tracker) Remove(topic string, partition int32) *Partition {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := tp{topic, partition}
	p := t.parts[k]
	if p != nil {
		p.Detach()
		delete(t.parts, k)
		delete(t.committed, k)
	}
	return p
}

// Each calls fn for every tracked assignment.
func (t *Tracker) Each(fn func(*Partition)) {
	t.mu.Lock()
	ps := make([]*Partition, 0, len(t.parts))
	for _, p := range t.parts {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	for _, p := range ps {
		fn(p)
	}
}

// dirty returns the committable offsets that moved past what was last
// committed, limited to only when only is non-nil, and the assignment each
// was read from.
func (t *Tracker) dirty(only map[string][]int32) (map[string]map[int32]kgo.EpochOffset, map[tp]*Partition) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]map[int32]kgo.EpochOffset)
	from := make(map[tp]*Partition)
	add := func(k tp, p *Partition) {
		o, ok := p.Committable()
		if !ok {
			return
		}
		if last, seen := t.committed[k]; seen && o.Offset <= last {
			return
		}
		if out[k.topic] == nil {
			out[k.topic] = make(map[int32]kgo.EpochOffset)
		}
		out[k.topic][k.partition] = kgo.EpochOffset{Epoch: o.Epoch, Offset: o.Offset}
		from[k] = p
	}
	if only == nil {
		for k, p := range t.parts {
			add(k, p)
		}
		return out, from
	}
	for topic, parts := range only {
		for _, part := range parts {
			k := tp{topic, part}
			if p := t.parts[k]; p != nil {
				add(k, p)
			}
		}
	}
	return out, from
}

// owned reports whether p is still the live assignment of its partition.
// An offset read from an assignment that ended since (revoked, or lost and
// assigned again) must not be committed: the partition's new owner, or this
// member's new assignment of it, commits its own.
func (t *Tracker) owned(k tp, p *Partition) bool {
	t.mu.Lock()
	cur := t.parts[k]
	t.mu.Unlock()
	return p != nil && cur == p && !p.Detached()
}

func (t *Tracker) markCommitted(topic string, partition int32, offset int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := tp{topic, partition}
	if _, ok := t.parts[k]; !ok {
		return
	}
	if last, ok := t.committed[k]; !ok || offset > last {
		t.committed[k] = offset
	}
}

// Result is the outcome of one offset commit request.
type Result struct {
	Offsets map[string]map[int32]kgo.EpochOffset // what was asked for
	Err     error                                // nil when every partition committed
}

// Committer commits a Tracker's watermarks through a group-consuming client.
// Commits are serialized, so an interval commit can never land after (and
// rewind) the commit made when a partition is revoked.
type Committer struct {
	cl      *kgo.Client
	tracker *Tracker
	mu      sync.Mutex
	onDone  func(Result)
}

// NewCommitter returns a Committer for the group that cl is a member of.
// onDone, if not nil, is called after every commit request.
func NewCommitter(cl *kgo.Client, t *Tracker, onDone func(Result)) *Committer {
	return &Committer{cl: cl, tracker: t, onDone: onDone}
}

// dropEnded removes from req the partitions whose assignment in from is no
// longer the live one.
func (c *Committer) dropEnded(req *kmsg.OffsetCommitRequest, from map[tp]*Partition) {
	topics := req.Topics[:0]
	for _, t := range req.Topics {
		parts := t.Partitions[:0]
		for _, p := range t.Partitions {
			if c.tracker.owned(tp{t.Topic, p.Partition}, from[tp{t.Topic, p.Partition}]) {
				parts = append(parts, p)
			}
		}
		if t.Partitions = parts; len(parts) > 0 {
			topics = append(topics, t)
		}
	}
	req.Topics = topics
}

// Commit commits the watermark of every tracked partition that advanced since
// its last commit; when only is not nil, just those partitions. It waits for
// the broker's answer and returns the first error.
func (c *Committer) Commit(ctx context.Context, only map[string][]int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	offsets, from := c.tracker.dirty(only)
	if len(offsets) == 0 {
		return nil
	}
	// The request is sent once any earlier commit is answered, possibly
	// after a rebalance: drop the partitions whose assignment ended since
	// their offsets were read, so that a late commit cannot rewind their
	// next owner.
	ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		c.dropEnded(req, from)
		return nil
	})
	var errs []error
	c.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					errs = append(errs, fmt.Errorf("commit %s[%d]: %w", t.Topic, p.Partition, err))
					continue
				}
				if o, ok := offsets[t.Topic][p.Partition]; ok {
					c.tracker.markCommitted(t.Topic, p.Partition, o.Offset)
				}
			}
		}
	})
	err := errors.Join(errs...)
	if c.onDone != nil {
		c.onDone(Result{Offsets: offsets, Err: err})
	}
	return err
}
