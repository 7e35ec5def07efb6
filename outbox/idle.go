package outbox

import (
	"context"
	"time"
)

// Waiting with nothing to publish, and halting a partition whose position
// is ahead of the database.

// idle waits, with nothing after the position pos, until a writer's commit
// wakes the publisher or the poll interval passes. First it checks that the
// database has handed pos out at all; when it has not, it halts the
// partition until ctx ends and reports false.
func (pub *publisher) idle(ctx context.Context, pos int64, poll *time.Timer) bool {
	if ahead, err := pub.ahead(ctx, pos); err == nil && ahead {
		pub.halt(ctx, pos)
		return false
	}
	poll.Reset(pub.r.o.PollInterval)
	select {
	case <-ctx.Done():
	case <-pub.wake:
	case <-poll.C:
	}
	return true
}

// ahead reports whether pos, the position the partition's position topic
// holds, is past the last sequence number the database handed out for the
// partition: the outbox tables were recreated (a new database, a forgotten
// migration run again on an empty one) or restored from a backup, or the
// relay reads another database than its writers. Publishing on would skip
// the rows numbered up to pos, and pruning would delete them unpublished.
func (pub *publisher) ahead(ctx context.Context, pos int64) (bool, error) {
	r := pub.r
	var handed int64
	err := r.o.Pool.QueryRow(ctx, `SELECT coalesce(max(next_seq) - 1, 0) FROM `+r.o.TablePrefix+`outbox_sequences
		WHERE outbox = $1 AND partition = $2`, r.o.Outbox, int32(pub.p)).Scan(&handed)
	return err == nil && pos > handed, err
}

// halt stops publishing the partition whose position is ahead of the
// database, and says so until ctx ends (the relay stops or loses the
// partition): it publishes and deletes nothing of the partition, so the
// rows the database holds stay there for the operator.
func (pub *publisher) halt(ctx context.Context, pos int64) {
	r := pub.r
	r.halted.Add(1)
	defer r.halted.Add(-1)
	msg := "kscope: outbox relay: the position topic says this partition is published up to a sequence number the database has not handed out: " +
		"the outbox tables were recreated or restored, or the relay reads another database than the writers. " +
		"Nothing of the partition is published or deleted until this is resolved: publishing on would skip, and delete, the rows numbered up to the position. " +
		"Stop the relays, compare the outbox table with what consumers of the topic saw, then either delete the position topic (the relay publishes every row the table holds) " +
		"or raise the partition's next_seq above the position (rows numbered up to it are never published), and start the relays again"
	attrs := []any{"outbox", r.o.Outbox, "partition", pub.p, "position", pos, "position_topic", r.o.PositionTopic}
	r.log.Error(msg, attrs...)
	t := time.NewTicker(errorLogEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.log.Error(msg, attrs...)
		}
	}
}
