package kscopetest

import (
	"context"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// The reasons the Kafka scope's duplicate, replay and out-of-order
// scenarios do not apply to a pipeline.
const (
	kafkaNoGuard = "the pipeline's txn.Options has neither Dedupe nor Versions: the Kafka scope then produces the outputs of %s again, " +
		"exactly once each (to the scope each input record is new); set KafkaPipeline.Options.Dedupe (the idempotency guard, " +
		"remembered in the scope's transactions) or Options.Versions to have the kit check that it produces no output"
	kafkaNoVersions = "the pipeline's txn.Options has no Versions: no per-key version to check (the idempotency guard, Options.Dedupe, " +
		"does not order records)"
	kafkaExtract = "Options.Versions.Extract reads the versions, and the kit can only write them in a header; " +
		"to have the kit check the gap policy, give it the pipeline with Versions.Header instead of Extract"
)

// kafkaGuardScenarios are the rows of the table that the Kafka scope
// holds only with its guard (Options.Dedupe) or its per-key versions
// (Options.Versions): an upstream duplicate, a replay and out-of-order
// versions.
var kafkaGuardScenarios = []kafkaScenario{
	{name: "duplicate_delivery_skipped", applies: unguarded("an upstream duplicate (the same message id sent twice)"), run: func(h *kafkaHarness) string {
		// The producer sends the message twice in a row, and a third time
		// once the first two are committed (a retry after a timeout), to
		// the member that takes over the partition: the same key, value
		// and message id, at later offsets of the same partition.
		a := h.record("dup")
		again := func() *kgo.Record { return &kgo.Record{Topic: a.Topic, Key: a.Key, Value: a.Value, Headers: a.Headers} }
		h.produce(a, again(), h.record(""))
		first := h.runner(h.txnID)
		if d := h.settle(first, 2*h.p.OutputsPerInput, 0); d != "" {
			return d
		}
		h.produce(again())
		second := h.runner(h.txnID)
		if d := h.settle(second, 2*h.p.OutputsPerInput, 0); d != "" {
			return "the third copy, after a restart: " + d
		}
		return both(expect(h.inject.callsOf("dup") == 1, "%d handler calls of the message delivered three times, want 1", h.inject.callsOf("dup")),
			both(h.skippedWords(first, 1), h.skippedWords(second, 1)))
	}},
	{name: "out_of_order_versions", applies: func(p KafkaPipeline) string {
		switch v := p.Options.Versions; {
		case v == nil:
			return kafkaNoVersions
		case v.Extract != nil:
			return kafkaExtract
		}
		return ""
	}, run: func(h *kafkaHarness) string {
		v := h.p.Options.Versions
		hdr := headerOr(v.Header, sequence.DefaultHeader)
		mk := func(ver int) *kgo.Record {
			r := h.record("")
			r.Key = []byte("versioned")
			r.Headers = setHeader(r.Headers, hdr, strconv.Itoa(ver))
			return r
		}
		h.produce(mk(1), mk(3), mk(2))
		// Wait: 3 parks until 2 is applied, then both apply; DeadLetter:
		// 3 goes to the DLT and 2 applies; Accept: 3 applies with its
		// gap, and 2, below it then, is stale.
		applied, dlt := 3, 0
		switch v.Gaps {
		case sequence.DeadLetter:
			applied, dlt = 2, 1
		case sequence.Accept:
			applied = 2
		}
		return h.settle(h.runner(h.txnID), applied*h.p.OutputsPerInput, dlt)
	}},
	{name: "replay_no_new_effects", applies: unguarded("a replay (the group's offsets reset to the start)"), run: func(h *kafkaHarness) string {
		for range 10 {
			h.produce(h.record(""))
		}
		if d := h.settle(h.runner(h.txnID), 10*h.p.OutputsPerInput, 0); d != "" {
			return d
		}
		if _, err := h.k.Admin().DeleteGroup(context.Background(), h.group); err != nil {
			return fmt.Sprintf("resetting the group: %v", err)
		}
		calls := h.inject.total()
		replay := h.runner(h.txnID)
		if d := h.settle(replay, 10*h.p.OutputsPerInput, 0); d != "" {
			return "the replay: " + d
		}
		return both(expect(h.inject.total() == calls, "%d handler calls during the replay of 10 committed inputs, want none", h.inject.total()-calls),
			h.skippedWords(replay, 10))
	}},
}

// unguarded returns the applies of a row that needs a repeated input, what,
// to produce no output again: it applies to a pipeline with the
// idempotency guard or per-key versions.
func unguarded(what string) func(p KafkaPipeline) string {
	return func(p KafkaPipeline) string {
		if p.Options.Dedupe != nil || p.Options.Versions != nil {
			return ""
		}
		return fmt.Sprintf(kafkaNoGuard, what)
	}
}

// skippedWords says whether r counted want inputs as repeats: duplicates
// with Options.Dedupe, stale versions with Options.Versions.
func (h *kafkaHarness) skippedWords(r *txn.Runner, want int64) string {
	st := r.Stats().Kafka
	if h.p.Options.Dedupe != nil {
		return expect(st.Duplicates == want, "the runner counted %d duplicates, want %d", st.Duplicates, want)
	}
	return expect(st.Stale == want, "the runner counted %d stale records, want %d", st.Stale, want)
}
