package txn

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
)

type tp struct {
	topic     string
	partition int32
}

// holds keeps retry-topic records back until their due time, inside the
// transactional loop.
//
// A record that is not due yet is not handled, and neither is anything
// after it in its partition: the partition is paused until the due time,
// the transaction commits that partition's offset at the held record (not
// past it, as the session would), and once the transaction has committed
// the consumer is rewound to the held record. The held record is thus
// neither lost (its offset was never committed) nor handled early; a crash
// at any point leaves it in its retry topic.
type holds struct {
	delays map[string]time.Duration // delay topics and the longest delay each may carry
	paused map[tp]time.Time         // paused partitions and when they are due
	inTxn  map[tp]kgo.EpochOffset   // partitions held in the open transaction, at the held record
}

func newHolds(delays map[string]time.Duration) *holds {
	return &holds{delays: delays, paused: map[tp]time.Time{}, inTxn: map[tp]kgo.EpochOffset{}}
}

// keep reports whether rec is held back: a delay-topic record that is not
// due, or behind one held in this transaction.
func (h *holds) keep(cl *kgo.Client, rec *kgo.Record, now time.Time) bool {
	maxDelay, ok := h.delays[rec.Topic]
	if !ok {
		return false
	}
	k := tp{rec.Topic, rec.Partition}
	if _, held := h.inTxn[k]; held {
		return true
	}
	due, _ := consumer.DueOf(&consumer.Record{Record: rec}, now, maxDelay)
	if !due.After(now) {
		return false
	}
	h.inTxn[k] = kgo.EpochOffset{Epoch: rec.LeaderEpoch, Offset: rec.Offset}
	h.paused[k] = due
	cl.PauseFetchPartitions(map[string][]int32{rec.Topic: {rec.Partition}})
	return true
}

// commitContext returns ctx for ending the transaction: the offsets it
// commits for held partitions stop at their held record.
func (h *holds) commitContext(ctx context.Context) context.Context {
	if len(h.inTxn) == 0 {
		return ctx
	}
	held := h.inTxn
	return kgo.PreTxnCommitFnContext(ctx, func(req *kmsg.TxnOffsetCommitRequest) error {
		for i := range req.Topics {
			t := &req.Topics[i]
			for j := range t.Partitions {
				if eo, ok := held[tp{t.Topic, t.Partitions[j].Partition}]; ok {
					t.Partitions[j].Offset = eo.Offset
					t.Partitions[j].LeaderEpoch = eo.Epoch
				}
			}
		}
		return nil
	})
}

// ended rewinds the held partitions to their held record after a commit
// (after an abort the session has rewound them to the last commit) and
// forgets the transaction's holds; the partitions stay paused until due.
func (h *holds) ended(cl *kgo.Client, committed bool) {
	if len(h.inTxn) == 0 {
		return
	}
	if committed {
		set := map[string]map[int32]kgo.EpochOffset{}
		for k, eo := range h.inTxn {
			if set[k.topic] == nil {
				set[k.topic] = map[int32]kgo.EpochOffset{}
			}
			set[k.topic][k.partition] = eo
		}
		cl.SetOffsets(set)
	}
	clear(h.inTxn)
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
