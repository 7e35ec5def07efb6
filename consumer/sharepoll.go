package consumer

// The share-group runner's poll loop (Config.Share): one poll at a time,
// each record acknowledged as its effect becomes durable, locks renewed
// while records run.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/internal/kafkaerr"
	"github.com/kscope-dev/kscope/partition"
	"github.com/kscope-dev/kscope/retrytopic"
)

// shareRun is a share-group runner's state; nil for a consumer group's.
type shareRun struct {
	cfg ShareConfig
	shareCounters

	// The poll loop's own: the records of the last poll (their locks are
	// renewed while any runs), when it returned, and when they are next
	// renewed.
	polled  []*kgo.Record
	polling time.Time
	renewAt time.Time
	// renewedUntil is, in Unix nanoseconds, when the locks of the last
	// poll's records end after their last renewal (0: not renewed).
	renewedUntil atomic.Int64
	// late says a record of the last poll finished after its lock had
	// expired, and was left for the next poll to accept.
	late atomic.Bool
}

// shareMaxDeliveries is cfg's ShareConfig.MaxDeliveries, 0 for a
// consumer group.
func shareMaxDeliveries(cfg Config) int32 {
	if cfg.Share == nil || cfg.Share.MaxDeliveries <= 0 {
		return 0
	}
	return int32(cfg.Share.MaxDeliveries)
}

// deliveries turns away a share group's record delivered more than
// MaxDeliveries times: it is dead-lettered without its handler.
func (c *callRules) deliveries(_ *failures, r *Record) error {
	if c.maxDeliveries == 0 {
		return nil
	}
	if n := r.DeliveryCount(); n > c.maxDeliveries {
		return retrytopic.Terminal(fmt.Errorf("%w: this is its delivery %d, past Share.MaxDeliveries %d (its earlier deliveries crashed their member, outran their acquisition lock, or were released unfinished)",
			ErrDeliveriesExhausted, n, c.maxDeliveries))
	}
	return nil
}

// shareClientOptions are a share-group runner's client options: its
// defaults, the user's, then the ones the runner rests on.
func (r *Runner) shareClientOptions() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.FetchMaxWait(500 * time.Millisecond),
		// Fetch only while a poll waits, and no more than it takes: a
		// record the client acquired and buffered while the handlers
		// run would see its lock run out before a handler saw it.
		kgo.MaxConcurrentFetches(0),
		kgo.ShareMaxRecordsStrict(),
	}
	opts = append(opts, r.cfg.ClientOptions...)
	opts = append(opts, r.extra...)
	return append(opts,
		kgo.SeedBrokers(r.cfg.Brokers...),
		kgo.ShareGroup(r.cfg.Group),
		kgo.ConsumeTopics(r.topics()...),
		kgo.ShareMaxRecords(int32(r.sharePollRecords())),
		kgo.ShareAckCallback(r.shareAcked),
		kgo.WithHooks(&r.brokers),
	)
}

// sharePollRecords is the most records one poll takes.
func (r *Runner) sharePollRecords() int {
	return max(min(r.share.cfg.MaxRecords, r.cfg.MaxInFlightRecords), 1)
}

// shareAcked counts the acknowledgements the broker refused, per
// partition and request.
func (r *Runner) shareAcked(_ *kgo.Client, res kgo.ShareAckResults) {
	for _, a := range res {
		if a.Err != nil {
			r.share.refused.Add(1)
			r.log.Warn("kscope: the broker refused acknowledgements of the share group; their records were (or will be) delivered again, to this member or another",
				"topic", a.Topic, "partition", a.Partition, "err", a.Err)
		}
	}
}

// configureShareGroup sets the share group's start (share.auto.offset.reset)
// and isolation level (read_committed), unless StartFrom says to leave them,
// and its lock duration when LockDuration says one.
func (r *Runner) configureShareGroup(ctx context.Context, cl *kgo.Client) error {
	set := map[string]string{}
	switch r.share.cfg.StartFrom {
	case ShareFromEarliest:
		set["share.auto.offset.reset"], set["share.isolation.level"] = "earliest", "read_committed"
	case ShareFromLatest:
		set["share.auto.offset.reset"], set["share.isolation.level"] = "latest", "read_committed"
	}
	if d := r.share.cfg.LockDuration; d > 0 {
		set["share.record.lock.duration.ms"] = strconv.FormatInt(d.Milliseconds(), 10)
	}
	if len(set) == 0 {
		return nil
	}
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = r.cfg.Group
	for name, v := range set {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Value = name, kmsg.StringPtr(v)
		c.Op = kmsg.IncrementalAlterConfigOpSet
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		for _, rr := range resp.Resources {
			if err = kerr.ErrorForCode(rr.ErrorCode); err != nil {
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("kscope: setting %v on share group %s (Config.Share.StartFrom and LockDuration; "+
			"the member needs ALTER_CONFIGS on the group, or set them yourself, use ShareStartAsConfigured and leave LockDuration 0): %w", set, r.cfg.Group, err)
	}
	return nil
}

// newShareClient configures the share group (configureShareGroup), then
// creates the member's client: the group's start is set before the member
// joins, since the broker initialises a partition's start when it first
// assigns it.
func (r *Runner) newShareClient(ctx context.Context) (*kgo.Client, error) {
	admin, err := kgo.NewClient(append(append([]kgo.Opt(nil), r.cfg.ClientOptions...), kgo.SeedBrokers(r.cfg.Brokers...))...)
	if err != nil {
		return nil, fmt.Errorf("kscope: creating the Kafka client that configures the share group: %w", err)
	}
	err = r.configureShareGroup(ctx, admin)
	admin.Close()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(r.shareClientOptions()...)
	if err != nil {
		return nil, fmt.Errorf("kscope: creating the Kafka client: %w", err)
	}
	return cl, nil
}

// sharePollLoop polls the share group until ctx ends: once every record
// of a poll is acknowledged, the next.
func (r *Runner) sharePollLoop(ctx context.Context) {
	r.shardBuf = make([][]*Record, r.cfg.Shards)
	r.shareApplyPauses()
	// The member is in the group once its client runs: a share group
	// assigns it no partitions to wait for (Health's readiness).
	r.joined.Store(true)
	for ctx.Err() == nil {
		if !r.shareWaitAcked(ctx) {
			return
		}
		if r.sharePollOnce(ctx) {
			return
		}
	}
}

// sharePollOnce polls once and dispatches what it fetched. It reports
// whether the client was closed.
func (r *Runner) sharePollOnce(ctx context.Context) (closed bool) {
	r.flushBeforeLate(ctx)
	r.loopBeat.wait()
	fetches := r.cl.PollRecords(ctx, r.sharePollRecords())
	r.loopBeat.back()
	if fetches.IsClientClosed() {
		return true
	}
	r.fetchErrors(fetches)
	if fetches.NumRecords() == 0 {
		return false
	}
	sh := r.share
	sh.polls.Add(1)
	sh.polled = sh.polled[:0]
	sh.polling = time.Now()
	sh.renewAt = time.Time{}
	sh.renewedUntil.Store(0)
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		sh.polled = append(sh.polled, p.Records...)
		for _, kr := range p.Records {
			if n := kr.DeliveryCount(); n > 1 {
				sh.redelivered.Add(1)
				if m := sh.cfg.MaxDeliveries; m > 0 && int(n) > m {
					sh.exhausted.Add(1)
				}
			}
		}
		// Each poll's records of a partition are an assignment of their
		// own: the client hands out records of one partition out of
		// order across polls (a released record comes back), which one
		// watermark could not follow, and nothing is committed.
		st := &partState{Assignment: partition.NewAssignment(r.assignCtx(), commit.NewPartition(p.Topic, p.Partition)), bufs: r.doneBufs}
		r.mu.Lock()
		r.parts[tp{p.Topic, p.Partition}] = st
		r.mu.Unlock()
		r.dispatchAll(p.Topic, p.Partition, p.HighWatermark, p.Records)
	})
	return false
}

// shareWaitAcked waits until every record of the last poll is finished
// (acknowledged), renewing the locks of those that run meanwhile. It
// reports false when ctx ended first.
func (r *Runner) shareWaitAcked(ctx context.Context) bool {
	if r.inflight.Load() == 0 {
		return true
	}
	r.waiting.Store(true)
	defer r.waiting.Store(false)
	r.loopBeat.wait()
	defer r.loopBeat.back()
	// Often enough to renew within a quarter of RenewBefore.
	tick := time.NewTicker(min(max(r.share.cfg.RenewBefore/4, 50*time.Millisecond), time.Second))
	defer tick.Stop()
	for r.inflight.Load() > 0 {
		r.renewLocks(ctx)
		select {
		case <-ctx.Done():
			return false
		case <-r.room:
		case <-tick.C:
		}
	}
	r.share.polled = r.share.polled[:0]
	return true
}

// renewLocks renews the acquisition locks of the last poll's records
// still running, RenewBefore before the earliest of them expires, and
// again a lock's length later.
func (r *Runner) renewLocks(ctx context.Context) {
	sh := r.share
	if sh.cfg.RenewBefore < 0 || len(sh.polled) == 0 {
		return
	}
	now := time.Now()
	if sh.renewAt.IsZero() {
		deadline := sh.polled[0].AcquisitionDeadline()
		if deadline.IsZero() {
			return
		}
		sh.renewAt = deadline.Add(-sh.cfg.RenewBefore)
	}
	if now.Before(sh.renewAt) {
		return
	}
	lock := max(sh.polled[0].AcquisitionDeadline().Sub(sh.polling), time.Second)
	for _, rec := range sh.polled {
		// A record acknowledged already is not renewed: the client's
		// state machine ignores a renewal after a terminal ack.
		rec.Ack(kgo.AckRenew)
	}
	sh.renewals.Add(int64(len(sh.polled)))
	sh.renewedUntil.Store(now.Add(lock).UnixNano())
	sh.renewAt = now.Add(max(lock-sh.cfg.RenewBefore, lock/3))
	// The client sends acknowledgements within a second; a renewal
	// cannot wait that long for a lock that ends within RenewBefore.
	fctx, cancel := context.WithTimeout(ctx, sh.cfg.RenewBefore/2)
	if err := r.cl.FlushAcks(fctx); err != nil && ctx.Err() == nil {
		r.log.Warn("kscope: renewing the acquisition locks of a share group's running records took longer than half of Share.RenewBefore; a lock may expire and its record go to another member",
			"records", len(sh.polled), "renew_before", sh.cfg.RenewBefore, "err", err)
	}
	cancel()
}

// routeBy is what rec is routed to its key-shard by: its key and
// Config.NullKeys, or, for a share group's record without
// ShareConfig.KeyOrder, its offset alone (spread).
func (r *Runner) routeBy(rec *kgo.Record) ([]byte, partition.NullKeyPolicy) {
	if !r.routesByKey() {
		return nil, partition.NullKeySpread
	}
	return rec.Key, r.cfg.NullKeys
}

// routesByKey reports whether routeBy reads records' keys: not for a share
// group without KeyOrder, whose records spread by offset.
func (r *Runner) routesByKey() bool { return r.share == nil || r.share.cfg.KeyOrder }

// fetchErrors reports a poll's fetch errors: a fatal one stops the runner,
// others are logged once as fetching failing, until a fetch succeeds.
func (r *Runner) fetchErrors(fetches kgo.Fetches) {
	failed := false
	fetches.EachError(func(topic string, p int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return
		}
		if kafkaerr.Fatal(err) {
			r.setFatal(fmt.Errorf("kscope: consuming %s[%d]: %w", topic, p, err))
			return
		}
		failed = true
		r.fetchHealth.failed(r.log, topic, p, err)
	})
	if !failed && fetches.NumRecords() > 0 {
		r.fetchHealth.ok(r.log)
	}
}

// shareAck acknowledges rec, once: accepted when the scope finished it,
// released when it was left unfinished.
func (r *Runner) shareAck(rec *Record, finished bool) {
	if r.share == nil {
		return
	}
	if finished {
		if r.shareLockLost(rec) {
			// Its lock expired: the broker may refuse an acceptance now,
			// and an acknowledgement it refuses fails those sent with it.
			// The next poll accepts it, alone (flushBeforeLate).
			r.share.lateAcks.Add(1)
			r.share.late.Store(true)
			return
		}
		rec.Ack(kgo.AckAccept)
		r.share.accepted.Add(1)
		return
	}
	rec.Ack(kgo.AckRelease)
	r.share.released.Add(1)
}

// shareLockLost reports whether rec's acquisition lock has expired: past
// its deadline, and past the last renewal's.
func (r *Runner) shareLockLost(rec *Record) bool {
	d := rec.AcquisitionDeadline()
	if d.IsZero() {
		return false
	}
	now := time.Now().UnixNano()
	return now > d.UnixNano() && now > r.share.renewedUntil.Load()
}

// flushBeforeLate sends the last poll's acknowledgements before the next
// poll when some of its records finished after their locks expired: the
// client accepts those at the poll, and a refusal of theirs then fails no
// acknowledgement of a record whose lock held.
func (r *Runner) flushBeforeLate(ctx context.Context) {
	if !r.share.late.Swap(false) {
		return
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.cl.FlushAcks(fctx); err != nil && ctx.Err() == nil {
		r.log.Warn("kscope: sending a share group's acknowledgements took over 5s", "err", err)
	}
}
