package consumer

// Share-group mode (Config.Share): its configuration, what it refuses,
// and its counters.

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kscope-dev/kscope/internal/dlreason"
	"github.com/kscope-dev/kscope/scope"
)

// ShareConfig makes the runner a member of a share group (KIP-932, "queues
// for Kafka") named Config.Group, instead of a consumer group. The members
// of a share group consume the same partitions together: the broker hands
// each record to one member under an acquisition lock, and the member
// acknowledges it record by record. More members than partitions all get
// records, and a slow record holds up nobody else.
//
// What stays: the handlers, routing, middleware, hooks and metrics, the
// failure policy's in-place retries and the dead-letter topic, the
// idempotency guards (the DB scope's inbox, Config.Dedupe). What differs:
//
//   - Order: there is none across members; within the member, the records
//     of one key run in order on its key-shard only with KeyOrder.
//   - Acknowledgement follows durability: a record is accepted once its
//     effect is durable (its handler returned nil in the AtLeastOnce scope,
//     its PostgreSQL transaction committed in the DB scope) or it was routed
//     (dead-lettered, skipped). A record left unfinished when the runner
//     stops is released at once, for another member. Nothing is committed:
//     a share group keeps no consumer offsets.
//   - One poll at a time: the member polls again only once every record of
//     its last poll is acknowledged (the client accepts whatever is left of
//     a poll at the next one), and it fetches only while it polls, so that
//     no record waits in a buffer while its lock runs out. A poll takes at
//     most MaxRecords records; a slow record delays the member's next poll
//     (not the other members). The runner renews the locks of records still
//     running (RenewBefore) so that a long handler keeps its record.
//   - Retries stay in place (Config.Failures, with DisableRetryTopics
//     implied): the retry topics' held records would stop the member's
//     polling. The broker's redeliveries (after a crash, a lost connection,
//     or a lock that expired) count against MaxDeliveries.
//   - Duplicates: a lock that expires while a handler still runs gives the
//     record to another member, and a crash redelivers what was not
//     acknowledged. The DB scope's inbox turns the second delivery into a
//     no-op (exactly-once effects); the AtLeastOnce scope handles it again
//     unless Config.Dedupe remembers it, and counts it (Stats.Share).
//
// The Kafka scope (package txn) has no share-group mode: a share group's
// acknowledgements are not part of Kafka transactions. Not available either
// with Config.TopicPatterns, Config.KeyBreaker, Config.Idle, Config.Periodic
// or Failures.Unordered. See
// docs/share-groups.md.
type ShareConfig struct {
	// KeyOrder routes each record by its key, as a consumer group does: the
	// records of one key that this member holds run one at a time, in the
	// order polled. Without it the records are spread over the key-shards
	// by offset, for the most parallelism.
	KeyOrder bool

	// MaxRecords is the most records one poll takes (and the broker hands
	// over in one fetch), at most Config.MaxInFlightRecords. Default
	// DefaultShareMaxRecords (500, Kafka's max.poll.records). Small polls
	// spread the records over more members; large ones cost fewer round
	// trips.
	MaxRecords int

	// MaxDeliveries is how many deliveries of one record the runner
	// handles: a record the broker delivers for a later time (its earlier
	// deliveries crashed the member, outran their lock, or were released
	// by a stop) goes to the dead-letter topic without its handler, with
	// the reason deliveries_exhausted. Default DefaultShareMaxDeliveries
	// (4): below the broker's group.share.delivery.count.limit (default 5),
	// past which the broker archives a record unacknowledged, so that a
	// record that kills every member that handles it is dead-lettered
	// instead of dropped. Keep it below the broker's limit.
	MaxDeliveries int

	// RenewBefore is how long before a running record's acquisition lock
	// expires the runner renews it (Kafka 4.2 or later). Default
	// DefaultShareRenewBefore (10s; the broker's lock lasts
	// group.share.record.lock.duration.ms, 30s by default). 0 keeps the
	// default; a negative value never renews.
	RenewBefore time.Duration

	// LockDuration, when positive, is the acquisition lock's length the
	// runner sets on the share group when it starts
	// (share.record.lock.duration.ms; within the broker's
	// group.share.min.record.lock.duration.ms and max). Default 0: the
	// group's setting, or the broker's group.share.record.lock.duration.ms
	// (30s by default). Renewals keep a long handler's record either way.
	LockDuration time.Duration

	// StartFrom is where the share group starts on a partition it has not
	// consumed yet: the group's share.auto.offset.reset, which the runner
	// sets when it starts (with share.isolation.level read_committed, so
	// that aborted transactional records are never delivered). Default
	// ShareFromEarliest, as a consumer group of kscope's starts.
	StartFrom ShareStart
}

// ShareStart is where a share group starts on a partition it has not
// consumed yet (ShareConfig.StartFrom).
type ShareStart int

const (
	// ShareFromEarliest starts from the partition's first record.
	ShareFromEarliest ShareStart = iota
	// ShareFromLatest starts from the records written after the group
	// started.
	ShareFromLatest
	// ShareStartAsConfigured leaves the group's configuration as it is
	// (the broker's default is latest); the runner sets neither
	// share.auto.offset.reset nor share.isolation.level.
	ShareStartAsConfigured
)

// String returns the name of s.
func (s ShareStart) String() string {
	switch s {
	case ShareFromEarliest:
		return "ShareFromEarliest"
	case ShareFromLatest:
		return "ShareFromLatest"
	case ShareStartAsConfigured:
		return "ShareStartAsConfigured"
	}
	return fmt.Sprintf("ShareStart(%d)", int(s))
}

// Defaults of ShareConfig.
const (
	DefaultShareMaxDeliveries = 4
	DefaultShareMaxRecords    = 500
	DefaultShareRenewBefore   = 10 * time.Second
)

// ErrDeliveriesExhausted is matched (errors.Is) by the error of a share
// group's record delivered more than ShareConfig.MaxDeliveries times: it is
// dead-lettered (class terminal) without its handler.
var ErrDeliveriesExhausted = dlreason.ErrDeliveriesExhausted

// ShareStats are a share-group runner's counters (Stats.Share); zero for a
// consumer group's.
type ShareStats struct {
	Polls       int64 // polls that returned records
	Accepted    int64 // records acknowledged as accepted: effect durable, or routed
	Released    int64 // records released unfinished (the runner stopped), for another member
	Redelivered int64 // records delivered to this member with a delivery count above 1: a crash, a lost connection, a lock that expired or a release before
	Renewals    int64 // acquisition locks renewed for records still running
	// AcksRefused counts the acknowledgement requests the broker refused
	// for a partition (one per partition and request), mostly for records
	// whose locks had expired and which went to another member: their
	// effects may be made twice (absorbed by the DB scope's inbox, or by
	// Config.Dedupe).
	AcksRefused int64
	Exhausted   int64 // records dead-lettered past MaxDeliveries
	// LocksLost counts records finished after their acquisition lock had
	// expired. The member accepts them at its next poll, apart from the
	// others (an acknowledgement the broker refuses fails those sent with
	// it); the broker may have given them to another member already.
	LocksLost int64
}

// shareCounters are the runner's ShareStats.
type shareCounters struct {
	polls, accepted, released, redelivered, renewals, refused, exhausted, lateAcks atomic.Int64
}

func (c *shareCounters) stats() ShareStats {
	return ShareStats{Polls: c.polls.Load(), Accepted: c.accepted.Load(), Released: c.released.Load(), Redelivered: c.redelivered.Load(),
		Renewals: c.renewals.Load(), AcksRefused: c.refused.Load(), Exhausted: c.exhausted.Load(), LocksLost: c.lateAcks.Load()}
}

// withDefaults fills in s's zero fields.
func (s ShareConfig) withDefaults() ShareConfig {
	if s.MaxRecords == 0 {
		s.MaxRecords = DefaultShareMaxRecords
	}
	if s.MaxDeliveries == 0 {
		s.MaxDeliveries = DefaultShareMaxDeliveries
	}
	if s.RenewBefore == 0 {
		s.RenewBefore = DefaultShareRenewBefore
	}
	return s
}

// checkShare refuses what a share group cannot do with cfg and the scope s.
func checkShare(cfg Config, s workScope) error {
	sc := cfg.Share
	if sc == nil {
		return nil
	}
	bad := func(field, reason string) error { return &ConfigError{Field: field, Reason: reason} }
	var errs []error
	if _, ok := s.(scope.Transactor[*Record]); ok {
		errs = append(errs, bad("Share", "is set for the Kafka scope, whose offsets are committed in its Kafka transactions: a share group's acknowledgements are not part of a transaction, so exactly-once within Kafka cannot hold; use a consumer group (leave Share nil), or the DB scope for a share group"))
	}
	if sc.MaxRecords < 0 {
		errs = append(errs, bad("Share.MaxRecords", fmt.Sprintf("is %d; use a positive count, or 0 for %d", sc.MaxRecords, DefaultShareMaxRecords)))
	}
	if sc.MaxDeliveries < 0 {
		errs = append(errs, bad("Share.MaxDeliveries", fmt.Sprintf("is %d; use a positive count below the broker's group.share.delivery.count.limit (default 5), or 0 for %d", sc.MaxDeliveries, DefaultShareMaxDeliveries)))
	}
	if sc.LockDuration < 0 || sc.LockDuration > 0 && sc.LockDuration < time.Millisecond {
		errs = append(errs, bad("Share.LockDuration", fmt.Sprintf("is %s; use at least a millisecond (the broker's minimum is group.share.min.record.lock.duration.ms, 15s by default), or 0 for the group's setting", sc.LockDuration)))
	}
	if sc.StartFrom < ShareFromEarliest || sc.StartFrom > ShareStartAsConfigured {
		errs = append(errs, bad("Share.StartFrom", fmt.Sprintf("is %s; use ShareFromEarliest, ShareFromLatest or ShareStartAsConfigured", sc.StartFrom)))
	}
	if len(cfg.TopicPatterns) > 0 {
		errs = append(errs, bad("TopicPatterns", "is set with Share: a share-group runner consumes the topics it names; list them in Topics"))
	}
	if u, ok := s.(scope.RetryTopicUser); ok && u.UsesRetryTopics() {
		errs = append(errs, bad("Failures.Unordered", "is set with Share: it sends failing records through the retry topics, whose held records would stop a share-group member's polling; leave Unordered false (a share group keeps no order to give up, and retries in place)"))
	}
	if cfg.KeyBreaker != nil {
		errs = append(errs, bad("KeyBreaker", "is set with Share: a held key's records would stay unacknowledged and stop the member's polling (a share group acknowledges a poll's records before the next); leave KeyBreaker nil, or use a consumer group"))
	}
	if cfg.Idle.After > 0 {
		errs = append(errs, bad("Idle", "is set with Share: idle calls follow the partitions assigned to the member, and a share group assigns none; leave Idle empty"))
	}
	if cfg.Periodic.Interval > 0 {
		errs = append(errs, bad("Periodic", "is set with Share: a share group assigns no partitions to a member, so there is no partition to run it on; leave Periodic empty"))
	}
	if p, ok := s.(scope.Periodic); ok && p.PeriodicInterval() > 0 {
		errs = append(errs, bad("Share", "is set for a scope with periodic work per assigned partition (dbscope.Options.Periodic): a share group assigns no partitions to a member; leave one of them out"))
	}
	return errors.Join(errs...)
}
