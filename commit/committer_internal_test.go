package commit

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// An offset read before a partition's assignment ended is not sent: the
// commit request, issued later (after an earlier commit's answer, possibly
// after a rebalance), keeps only partitions whose assignment is still the
// one the offset was read from.
func TestCommitDropsPartitionsWhoseAssignmentEnded(t *testing.T) {
	tr := NewTracker()
	for p := range int32(3) {
		w := tr.Assign("t", p)
		w.Add(5, 1)
		w.Done(5)
	}
	offsets, from := tr.dirty(nil)
	if len(offsets["t"]) != 3 {
		t.Fatalf("dirty %v", offsets)
	}
	// Between reading and sending: partition 1 is lost and assigned to
	// this member again (a new assignment), partition 2 is lost for good.
	tr.Remove("t", 1)
	tr.Assign("t", 1)
	tr.Remove("t", 2)

	req := kmsg.NewPtrOffsetCommitRequest()
	topic := kmsg.NewOffsetCommitRequestTopic()
	topic.Topic = "t"
	for p, eo := range offsets["t"] {
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset = p, eo.Offset
		topic.Partitions = append(topic.Partitions, rp)
	}
	req.Topics = append(req.Topics, topic)
	(&Committer{tracker: tr}).dropEnded(req, from)
	if len(req.Topics) != 1 || len(req.Topics[0].Partitions) != 1 || req.Topics[0].Partitions[0].Partition != 0 {
		t.Fatalf("request after the rebalance commits %+v; want partition 0 only", req.Topics)
	}
}
