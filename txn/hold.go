package txn

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/engine"
)

type tp struct {
	topic     string
	partition int32
}

// holds keeps retry-topic records back until their due time.
//
// A record that is not due yet is not handled, and neither is anything
// after it in its partition: the partition is paused until the due time
// and the consumer is rewound to the held record. The held record is never
// delivered to the partition's tracker, so the offset the transactions
// commit for the partition stays at or below it: it is neither lost nor
// handled early, and a crash at any point leaves it in its retry topic.
type holds struct {
	delays map[string]time.Duration // delay topics and the longest delay each may carry
	paused map[tp]time.Time         // paused partitions and when they are due
	batch  map[tp]kgo.EpochOffset   // partitions held in the records being delivered, at the held record
}

func newHolds(delays map[string]time.Duration) *holds {
	return &holds{delays: delays, paused: map[tp]time.Time{}, batch: map[tp]kgo.EpochOffset{}}
}

// keep reports whether rec is held back: a delay-topic record that is not
// due, or behind one held in the same poll.
func (h *holds) keep(cl *kgo.Client, rec *kgo.Record, now time.Time) bool {
	maxDelay, ok := h.delays[rec.Topic]
	if !ok {
		return false
	}
	k := tp{rec.Topic, rec.Partition}
	if _, held := h.batch[k]; held {
		return true
	}
	due, _ := engine.DueOf(&consumer.Record{Record: rec}, now, maxDelay)
	if !due.After(now) {
		return false
	}
	h.batch[k] = kgo.EpochOffset{Epoch: rec.LeaderEpoch, Offset: rec.Offset}
	h.paused[k] = due
	cl.PauseFetchPartitions(map[string][]int32{rec.Topic: {rec.Partition}})
	return true
}

// rewind rewinds the partitions held in the records just delivered to
// their held record; they stay paused until due.
func (h *holds) rewind(cl *kgo.Client) {
	if len(h.batch) == 0 {
		return
	}
	set := map[string]map[int32]kgo.EpochOffset{}
	for k, eo := range h.batch {
		if set[k.topic] == nil {
			set[k.topic] = map[int32]kgo.EpochOffset{}
		}
		set[k.topic][k.partition] = eo
	}
	cl.SetOffsets(set)
	clear(h.batch)
}

// resume resumes the paused partitions that are due and returns when the
// next one is (zero when none is paused).
func (h *holds) resume(cl *kgo.Client, now time.Time) time.Time {
	var next time.Time
	due := map[string][]int32{}
	for k, at := range h.paused {
		if !at.After(now) {
			due[k.topic] = append(due[k.topic], k.partition)
			delete(h.paused, k)
			continue
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	if len(due) > 0 {
		cl.ResumeFetchPartitions(due)
	}
	return next
}
