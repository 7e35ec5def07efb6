package main

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/devenv"
)

// The demo's topics and groups. Their names end in the run's suffix
// (devenv.RunName), so that the demo runs again and again against the same
// broker and database; the parent passes its run id to its children
// (runEnv). A service uses fixed names.
var (
	topic         string // the payment captures
	group         string // the ledger
	bookedTopic   string // payment.booked, published through the outbox
	notifierGroup string // the notification service
)

func init() { setNames() }

// setNames names the run's topics and groups; a child calls it again with
// its parent's run id.
func setNames() {
	topic = devenv.RunName("payments.captured")
	group = devenv.RunName("ledger")
	bookedTopic = devenv.RunName("payment.booked")
	notifierGroup = devenv.RunName("notifications")
}

// outboxName is the outbox's name: its relay's group, transactional ids
// and position topic derive from it (see outbox.Options).
func outboxName() string { return bookedTopic }

// admin wraps the demo's admin client with what it reads of the topics.
type admin struct{ *kadm.Client }

// endOffsets returns topic's end offset per partition.
func (a admin) endOffsets(ctx context.Context, topic string) map[int32]int64 {
	out := map[int32]int64{}
	resp, err := a.ListEndOffsets(ctx, topic)
	if err != nil {
		return out
	}
	resp.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			out[o.Partition] = o.Offset
		}
	})
	return out
}

// committed returns group's committed offset per partition of topic.
func (a admin) committed(ctx context.Context, group, topic string) map[int32]int64 {
	out := map[int32]int64{}
	resp, err := a.FetchOffsetsForTopics(ctx, group, topic)
	if err != nil {
		return out
	}
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.At >= 0 {
			out[o.Partition] = o.At
		}
	})
	return out
}

// caughtUp reports whether group's committed offsets reach the end of
// every partition of topic.
func (a admin) caughtUp(ctx context.Context, group, topic string) bool {
	ends := a.endOffsets(ctx, topic)
	if len(ends) == 0 {
		return false
	}
	com := a.committed(ctx, group, topic)
	for p, e := range ends {
		if e > 0 && com[p] != e {
			return false
		}
	}
	return true
}

// readAll reads every record of topic, read_committed, up to the end
// offsets it has when called. Transaction markers and aborted records take
// offsets without being records, so a partition is read to its end once a
// record or marker at its last offset is seen.
func readAll(ctx context.Context, brokers []string, a admin, topic string) ([]*kgo.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ends := a.endOffsets(ctx, topic)
	left := 0
	for _, e := range ends {
		if e > 0 {
			left++
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []*kgo.Record
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("reading %s: %d partitions not read to their end: %w", topic, left, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end := ends[r.Partition]; end > 0 && r.Offset == end-1 {
				left--
			}
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
		})
	}
	return out, nil
}

// header returns the value of r's last header named key ("" if none).
func header(r *kgo.Record, key string) string {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == key {
			return string(r.Headers[i].Value)
		}
	}
	return ""
}
