package kscopetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/sequence"
)

// scenario is one scenario of the delivery-semantics table: run returns ""
// when its guarantee held, what broke, or notApplicable(why). Every
// scenario runs in DB; Scope runs those that are not dbOnly (they need the
// DB scope's options, such as per-key versions).
type scenario struct {
	name   string
	run    func(h *harness) string
	dbOnly bool
}

const noUndecodable = "the pipeline has no Undecodable: give it one that returns a record its handler rejects with consumer.DecodeError"

func expect(cond bool, format string, args ...any) string {
	if cond {
		return ""
	}
	return fmt.Sprintf(format, args...)
}

// scopeScenarios returns the scenarios that apply to any scope built on
// the contract.
func scopeScenarios() []scenario {
	var out []scenario
	for _, sc := range scenarios {
		if !sc.dbOnly {
			out = append(out, sc)
		}
	}
	return out
}

// duplicatesWords says, for a scenario's check, whether the runner counted
// want duplicates: "" when it did, or when it keeps no such counter (a
// scope of the service's own).
func (h *harness) duplicatesWords(r kitRunner, want int64) string {
	if h.p.duplicates == nil {
		return ""
	}
	got := h.p.duplicates(r.Stats())
	return expect(got == want, "the runner counted %d duplicates, want %d", got, want)
}

// both joins the details of two checks: "" when both held.
func both(a, b string) string {
	if a == "" || b == "" {
		return a + b
	}
	return a + "; " + b
}

var scenarios = []scenario{
	{name: "success_then_commit", run: func(h *harness) string {
		for i := range 10 {
			h.produce(h.record(fmt.Sprintf("k%d", i), ""))
		}
		r := h.runner(nil)
		if d := h.until(r, "10 effects and committed offsets", func() bool { return h.effects() >= 10 && h.committed() }); d != "" {
			return d
		}
		return expect(h.effects() == 10, "%d effects for 10 records", h.effects())
	}},
	{name: "duplicate_delivery_skipped", run: func(h *harness) string {
		// The producer sends the message twice in a row, and a third time
		// once the first two are done (a retry after a timeout): the same
		// key, value and message id, at later offsets.
		a := h.record("k", "dup-1")
		again := func() *kgo.Record { return &kgo.Record{Topic: a.Topic, Key: a.Key, Value: a.Value, Headers: a.Headers} }
		h.produce(a, again(), h.record("k2", ""))
		r := h.runner(nil)
		late := false
		if d := h.until(r, "every delivery done", func() bool {
			if !late && r.Stats().Done >= 3 && h.committed() {
				h.produce(again())
				late = true
			}
			return late && r.Stats().Done >= 4 && h.committed()
		}); d != "" {
			return d
		}
		return both(expect(h.effects() == 2 && h.callsOf("dup-1") == 1, "%d effects, %d handler calls of the message delivered three times, for it and one other", h.effects(), h.callsOf("dup-1")),
			h.duplicatesWords(r, 2))
	}},
	{name: "crash_before_offset_commit", run: func(h *harness) string {
		for i := range 10 {
			h.produce(h.record(fmt.Sprintf("k%d", i), ""))
		}
		// Every offset commit fails: as far as Kafka knows, the consumer
		// died before committing anything. A real broker cannot be told to
		// fail; there the first runner's commits are undone once it has
		// stopped, which leaves Kafka knowing as little.
		fault, faultErr := h.k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: h.group, Err: kerr.CoordinatorNotAvailable, Count: -1})
		first := h.runner(func(c *consumer.Config) { c.DrainTimeout = 500 * time.Millisecond })
		if d := h.until(first, "10 effects", func() bool { return h.effects() >= 10 }); d != "" {
			return d
		}
		if faultErr == nil {
			fault.Remove()
		} else if err := h.rewind(); err != nil {
			return err.Error()
		}
		second := h.runner(nil)
		if d := h.until(second, "the redelivery", func() bool { return h.committed() }); d != "" {
			return d
		}
		return expect(h.effects() == 10, "%d effects after the redelivery of 10 applied records", h.effects())
	}},
	{name: "retryable_failure_retried", run: func(h *harness) string {
		rec := h.record("k", "flaky-1")
		h.inject.failOn("flaky-1", func(n int) error {
			if n <= 2 {
				return consumer.Retryable(errors.New("kscopetest: injected transient failure"))
			}
			return nil
		})
		h.produce(rec)
		r := h.runner(nil)
		if d := h.until(r, "the record applied", func() bool { return h.effects() >= 1 && h.committed() }); d != "" {
			return d
		}
		return expect(h.effects() == 1 && h.callsOf("flaky-1") == 3, "%d effects, %d handler calls for a record failing twice then succeeding", h.effects(), h.callsOf("flaky-1"))
	}},
	{name: "non_retryable_failure_to_dlt", run: func(h *harness) string {
		h.inject.failOn("bad-1", func(int) error { return consumer.Terminal(errors.New("kscopetest: injected terminal failure")) })
		h.produce(h.record("k", "bad-1"), h.record("k2", ""))
		r := h.runner(nil)
		if d := h.until(r, "both records done", func() bool { return h.committed() && r.Stats().Done >= 2 }); d != "" {
			return d
		}
		dlt := h.dlt()
		return expect(h.effects() == 1 && len(dlt) == 1 && h.callsOf("bad-1") == 1, "%d effects, %d DLT records, %d calls of the failing record", h.effects(), len(dlt), h.callsOf("bad-1"))
	}},
	{name: "undecodable_record_to_dlt", run: func(h *harness) string {
		if h.p.undecodable == nil {
			return notApplicable(noUndecodable)
		}
		bad := h.p.undecodable()
		bad.Topic, bad.Key = h.topic, []byte("k")
		bad.Headers = setHeader(bad.Headers, h.idHeader(), h.inject.prefix+"undecodable-1")
		h.produce(bad, h.record("k2", ""))
		r := h.runner(nil)
		if d := h.until(r, "both records done", func() bool { return h.committed() && r.Stats().Done >= 2 }); d != "" {
			return d
		}
		dlt := h.dlt()
		return expect(h.effects() == 1 && len(dlt) == 1, "%d effects, %d DLT records for one undecodable and one good record", h.effects(), len(dlt))
	}},
	{name: "poison_bounded_then_dlt", run: func(h *harness) string {
		h.inject.failOn("poison-1", func(int) error { return errors.New("kscopetest: injected failure, every time") })
		h.produce(h.record("k", "poison-1"))
		r := h.runner(nil)
		budget := r.Config().Failures.UnknownAttempts
		if d := h.until(r, "the poison dead-lettered", func() bool { return h.committed() && len(h.dlt()) == 1 }); d != "" {
			return d
		}
		return expect(h.callsOf("poison-1") == budget && h.effects() == 0, "poison handled %d times (budget %d), %d effects", h.callsOf("poison-1"), budget, h.effects())
	}},
	{name: "out_of_order_versions", run: func(h *harness) string {
		v := h.p.versions
		switch {
		case v == nil:
			return notApplicable("the pipeline has no Options.Versions: no per-key version to check")
		case v.Extract != nil:
			return notApplicable("Options.Versions.Extract reads the versions, and the kit can only write them in a header; " +
				"to have the kit check the gap policy, give it the pipeline with Versions.Header instead of Extract")
		}
		hdr := headerOr(v.Header, sequence.DefaultHeader)
		mk := func(ver int) *kgo.Record {
			r := h.record("versioned", "")
			r.Headers = setHeader(r.Headers, hdr, strconv.Itoa(ver))
			return r
		}
		h.produce(mk(1), mk(3), mk(2))
		r := h.runner(nil)
		want, wantDLT := 3, 0
		if v.Gaps == sequence.DeadLetter {
			want, wantDLT = 2, 1
		}
		if d := h.until(r, "the versions settled", func() bool { return h.committed() && h.effects() >= want && len(h.dlt()) >= wantDLT }); d != "" {
			return d
		}
		return expect(h.effects() == want && len(h.dlt()) == wantDLT, "versions 1, 3, 2: %d effects and %d DLT records, want %d and %d", h.effects(), len(h.dlt()), want, wantDLT)
	}, dbOnly: true},
	{name: "batch_partial_failure", run: func(h *harness) string {
		var recs []*kgo.Record
		for i := range 20 {
			recs = append(recs, h.record(fmt.Sprintf("k%d", i), fmt.Sprintf("batch-%d", i)))
		}
		h.inject.failOn("batch-7", func(int) error { return consumer.Terminal(errors.New("kscopetest: injected failure mid-batch")) })
		h.produce(recs...)
		r := h.runner(func(c *consumer.Config) { c.Shards = 1 })
		if d := h.until(r, "the batch done", func() bool { return h.committed() && r.Stats().Done >= 20 }); d != "" {
			return d
		}
		return expect(h.effects() == 19 && len(h.dlt()) == 1, "%d effects and %d DLT records for a batch of 20 with one failing", h.effects(), len(h.dlt()))
	}},
	{name: "replay_no_new_effects", run: func(h *harness) string {
		for i := range 10 {
			h.produce(h.record(fmt.Sprintf("k%d", i), ""))
		}
		first := h.runner(nil)
		if d := h.until(first, "the first pass", func() bool { return h.effects() >= 10 && h.committed() }); d != "" {
			return d
		}
		if _, err := h.k.Admin().DeleteGroup(context.Background(), h.group); err != nil {
			return fmt.Sprintf("resetting the group: %v", err)
		}
		calls := h.inject.total()
		replay := h.runner(nil)
		if d := h.until(replay, "the replay", func() bool { return replay.Stats().Done >= 10 }); d != "" {
			return d
		}
		return both(expect(h.effects() == 10 && h.inject.total() == calls, "after the replay: %d effects, %d handler calls during the replay", h.effects(), h.inject.total()-calls),
			h.duplicatesWords(replay, 10))
	}},
}
