package kscopetest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// shareScenarios are the share-group table's scenarios (DBShare).
var shareScenarios = []scenario{
	{name: "share_success_then_accept", run: shareSuccess},
	{name: "share_duplicate_delivery_skipped", run: shareDuplicate},
	{name: "share_redelivery_after_lock_expiry", run: shareLockExpiry},
	{name: "share_poison_to_dlt_with_delivery_count", run: sharePoison},
	{name: "share_crash_mid_transaction", run: shareCrash},
	{name: "share_replay_no_new_effects", run: shareReplay},
}

func shareSuccess(h *harness) string {
	for i := range 10 {
		h.produce(h.record(fmt.Sprintf("k%d", i), ""))
	}
	r := h.runner(nil)
	if d := h.until(r, "10 effects and 10 records accepted", func() bool {
		accepted, _, _ := shareStats(r)
		return h.effects() >= 10 && accepted >= 10
	}); d != "" {
		return d
	}
	return expect(h.effects() == 10, "%d effects for 10 records", h.effects())
}

func shareDuplicate(h *harness) string {
	// The producer sends the message twice in a row, and a third time
	// once the first two are done: the same key, value and message id, at
	// later offsets.
	a := h.record("k", "dup-1")
	again := func() *kgo.Record { return &kgo.Record{Topic: a.Topic, Key: a.Key, Value: a.Value, Headers: a.Headers} }
	h.produce(a, again(), h.record("k2", ""))
	r := h.runner(nil)
	late := false
	if d := h.until(r, "every delivery accepted", func() bool {
		accepted, _, _ := shareStats(r)
		if !late && accepted >= 3 {
			h.produce(again())
			late = true
		}
		return late && accepted >= 4
	}); d != "" {
		return d
	}
	return both(expect(h.effects() == 2 && h.callsOf("dup-1") == 1, "%d effects, %d handler calls of the message delivered three times, for it and one other", h.effects(), h.callsOf("dup-1")),
		h.duplicatesWords(r, 2))
}

// noRenewals makes a runner's locks last ShareLock, never renewed.
func noRenewals(c *consumer.Config) {
	sc := *c.Share
	sc.RenewBefore, sc.LockDuration = -1, ShareLock
	c.Share = &sc
}

func shareLockExpiry(h *harness) string {
	if why := shortLocks(); why != "" {
		return notApplicable(why)
	}
	// The first delivery's handler outlives its lock (renewals off): the
	// broker gives the record to the other member meanwhile. Either
	// delivery may commit first; the other meets the inbox.
	h.inject.failOn("slow-1", func(n int) error {
		if n == 1 {
			time.Sleep(2*ShareLock + ShareLock/2)
		}
		return nil
	})
	h.inject.expectAgain("slow-1")
	h.produce(h.record("k", "slow-1"), h.record("k2", ""))
	other := start(h.runner(noRenewals))
	r := h.runner(noRenewals)
	var redelivered int64
	d := h.until(r, "the record delivered again and both deliveries done", func() bool {
		redelivered = r.Stats().Share.Redelivered + other.r.Stats().Share.Redelivered
		_, done, _ := shareStats(r, other.r)
		return redelivered >= 1 && done >= 3 && h.inject.returned("slow-1") >= 1
	})
	d = both(d, other.stop())
	if d != "" {
		return d
	}
	_, _, dups := shareStats(r, other.r)
	return expect(h.effects() == 2 && dups >= 1, "%d effects for 2 records, one of them delivered twice (its first handler outlived its lock); %d duplicates counted",
		h.effects(), dups)
}

// shortLocks says why the lock-expiry scenario cannot run on this
// backend ("" when it can): a broker the tests did not start keeps its
// own minimum lock.
func shortLocks() string {
	kind, err := testenv.KafkaKind()
	if err != nil {
		return err.Error()
	}
	if kind != "kfake" && kind != "apache" {
		return fmt.Sprintf("a %s broker keeps its own group.share.min.record.lock.duration.ms (15s by default), which ShareLock is below", kind)
	}
	return ""
}

func sharePoison(h *harness) string {
	h.inject.failOn("poison-1", func(int) error { return errors.New("kscopetest: injected failure, every time") })
	h.produce(h.record("k", "poison-1"), h.record("k2", ""))
	r := h.runner(nil)
	budget := r.Config().Failures.UnknownAttempts
	if d := h.until(r, "the poison dead-lettered and both records accepted", func() bool {
		accepted, _, _ := shareStats(r)
		return accepted >= 2 && len(h.dlt()) == 1
	}); d != "" {
		return d
	}
	dlt := h.dlt()
	count := testenv.Header(dlt[0], retrytopic.HeaderDeliveryCount)
	return expect(h.callsOf("poison-1") == budget && h.effects() == 1 && count == "1",
		"poison handled %d times (budget %d), %d effects for it and one good record, its dead letter's %s %q (want \"1\")",
		h.callsOf("poison-1"), budget, h.effects(), retrytopic.HeaderDeliveryCount, count)
}

func shareCrash(h *harness) string {
	// crash-1's handler does its work, in its transaction, and the runner
	// stops before the commit: the call waits for the runner to give up on
	// it (its drain timeout) and then fails, so that the transaction rolls
	// back. The record is released unfinished, and a second runner gets it
	// again: what the handler did outside its transaction shows twice.
	entered, release := make(chan struct{}), make(chan struct{})
	h.inject.crashOn("crash-1", func(n int) error {
		if n > 1 {
			return nil
		}
		close(entered)
		<-release
		return errors.New("kscopetest: the runner stopped between the handler and the commit")
	})
	h.produce(h.record("k-crash", "crash-1"))
	first := start(h.runner(func(c *consumer.Config) { c.DrainTimeout = 200 * time.Millisecond }))
	select {
	case <-entered:
	case <-time.After(time.Minute):
		close(release)
		return both("timed out waiting for crash-1's handler", first.stop())
	}
	// Run returns once the drain timeout passed, saying that a handler
	// ignored its canceled context: the crash this scenario makes.
	first.stop()
	close(release)
	// More records for the second runner; the first one's only record
	// was crash-1, so that none waited behind it on its key-shard.
	for i := range 5 {
		h.produce(h.record(fmt.Sprintf("k%d", i), ""))
	}
	second := h.runner(nil)
	if d := h.until(second, "6 effects after the redelivery", func() bool {
		return h.effects() >= 6 && h.callsOf("crash-1") >= 2 && second.Stats().Done >= 1
	}); d != "" {
		return d
	}
	return expect(h.effects() == 6, "%d effects for 6 records, one of them left mid-transaction by a runner that stopped", h.effects())
}

func shareReplay(h *harness) string {
	for i := range 10 {
		h.produce(h.record(fmt.Sprintf("k%d", i), ""))
	}
	first := h.runner(nil)
	if d := h.until(first, "the first pass", func() bool {
		accepted, _, _ := shareStats(first)
		return h.effects() >= 10 && accepted >= 10
	}); d != "" {
		return d
	}
	if err := h.resetShareGroup(); err != nil {
		return err.Error()
	}
	calls := h.inject.total()
	replay := h.runner(nil)
	if d := h.until(replay, "the replay", func() bool { return replay.Stats().Done >= 10 }); d != "" {
		return d
	}
	return both(expect(h.effects() == 10 && h.inject.total() == calls, "after the replay: %d effects, %d handler calls during the replay", h.effects(), h.inject.total()-calls),
		h.duplicatesWords(replay, 10))
}

// resetShareGroup sets the stopped share group's start offset of the
// scenario's topic back to its start, so that every record is delivered
// again.
func (h *harness) resetShareGroup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var start kadm.Offsets
	start.Add(kadm.Offset{Topic: h.topic, Partition: 0, At: 0, LeaderEpoch: -1})
	var err error
	// The broker refuses the reset while the group still has members:
	// the stopped runner's leave may take a heartbeat to be seen.
	for {
		var resp kadm.AlterShareGroupOffsetsResponses
		resp, err = h.k.Admin().AlterShareGroupOffsets(ctx, h.group, start)
		if err == nil {
			err = resp.Error()
		}
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("kscopetest: resetting share group %s to the start of %s: %w", h.group, h.topic, err)
	}
	return nil
}
