package retrytopic

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// DeadLettersWaiting returns, per partition of the dead-letter topic dlt
// of consumer group group, how many of its offsets wait for triage: from
// the triage group's committed offset (TriageGroup, which kscope dlt
// redrive commits), or the partition's start when that is later or
// nothing is committed, up to the partition's end. A dead letter raises
// it; a redrive that handled the records in offset order lowers it.
//
// It counts offsets, not records: in a topic written in transactions (the
// Kafka scope's dead letters) each commit marker takes an offset too, so
// the count is an upper bound until a redrive passes them. It costs three
// requests (start and end offsets, and the triage group's offsets).
func DeadLettersWaiting(ctx context.Context, adm *kadm.Client, group, dlt string) (map[int32]int64, error) {
	starts, err := adm.ListStartOffsets(ctx, dlt)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("retrytopic: listing the start offsets of the dead-letter topic %s: %w", dlt, err)
	}
	ends, err := adm.ListEndOffsets(ctx, dlt)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("retrytopic: listing the end offsets of the dead-letter topic %s: %w", dlt, err)
	}
	committed, err := TriageOffsets(ctx, adm, group, dlt)
	if err != nil {
		return nil, err
	}
	waiting := map[int32]int64{}
	ends.Each(func(e kadm.ListedOffset) {
		from := int64(0)
		if s, ok := starts.Lookup(e.Topic, e.Partition); ok {
			from = s.Offset
		}
		if c, ok := committed.Lookup(e.Topic, e.Partition); ok && c.At >= 0 {
			from = max(from, c.At)
		}
		waiting[e.Partition] = max(e.Offset-from, 0)
	})
	return waiting, nil
}

// TriageOffsets returns the offsets the triage group of consumer group
// group (TriageGroup) committed on the dead-letter topic dlt; nil when it
// never committed. While the group's coordinator is not ready (a cluster
// creates its offsets topic on the first group request and answers
// COORDINATOR_NOT_AVAILABLE until then; a coordinator moving or loading
// answers alike) it asks again, until ctx ends.
func TriageOffsets(ctx context.Context, adm *kadm.Client, group, dlt string) (kadm.OffsetResponses, error) {
	wait := 50 * time.Millisecond
	for {
		committed, err := adm.FetchOffsetsForTopics(ctx, TriageGroup(group), dlt)
		if err == nil {
			err = committed.Error()
		}
		switch {
		case errors.Is(err, kerr.GroupIDNotFound):
			return nil, nil // nothing committed yet
		case err == nil:
			return committed, nil
		case !kerr.IsRetriable(err) || ctx.Err() != nil:
			return nil, fmt.Errorf("retrytopic: fetching the offsets group %s committed on %s: %w", TriageGroup(group), dlt, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("retrytopic: fetching the offsets group %s committed on %s: %w", TriageGroup(group), dlt, err)
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}
