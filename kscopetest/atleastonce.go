package kscopetest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
)

// AtLeastOncePipeline describes a service's AtLeastOnce pipeline
// (consumer.New) to the kit.
type AtLeastOncePipeline struct {
	// Handler is the service's handler, unchanged.
	Handler consumer.Handler
	// BatchHandler, instead of Handler, is the service's batch handler
	// (consumer.NewBatch), unchanged: the kit runs the same table. A
	// consumer.FailedAt error makes the records before the failing one
	// effects of the call.
	BatchHandler consumer.BatchHandler
	// Config, when not nil, adjusts the consumer configuration the kit
	// builds (brokers, group and topic are the kit's). To have the kit
	// check the duplicate, crash and replay rows, it sets the idempotency
	// guard as the service runs it: consumer.Config.Dedupe with a Store
	// (dedupe.NewMemory, dedupe.NewPostgres, redisstore.New). Make the
	// store once, outside Config, which the kit calls for every runner
	// (the crash and replay scenarios run two, one after the other, and
	// the second must find what the first remembered); every scenario may
	// share it: the kit's message ids are its scenario's own.
	Config func(consumer.Config) consumer.Config
	// Valid returns the i-th well-formed input record (value and any
	// headers; the kit sets topic, key and message id).
	Valid func(i int) *kgo.Record
	// Undecodable returns a record the handler rejects as poison
	// (consumer.DecodeError). Nil skips that scenario.
	Undecodable func() *kgo.Record
	// Effects, when not nil, counts the handler's effects where it makes
	// them (a fake of the service it calls, a table it writes), in total:
	// the kit counts those a scenario adds (the difference from its
	// start), so one counter serves every scenario. Give the handler an
	// effect that a second application would show, such as a call or an
	// entry per record. Nil: the kit counts as the effects the handler's
	// calls that returned nil, each one an application of its record.
	Effects func(ctx context.Context) (int, error)
}

// AtLeastOnce runs the delivery-semantics table against p, an AtLeastOnce
// pipeline, and returns the report; each failing scenario also fails its
// subtest of t. The rows the scope holds on its own run always: success
// then commit, retryable failure retried, non-retryable failure and
// undecodable record to the DLT, poison bounded then the DLT, batch partial
// failure. The rows that need each record applied once run when p's
// Config sets consumer.Config.Dedupe.Store, the scope's idempotency guard:
//
//   - duplicate delivery: a message sent twice (the same message id, a
//     later offset) is handled once, and Stats().Dedupe.Hits counts it;
//   - crash before the offset commit: the records handled, remembered and
//     not committed are redelivered and skipped, not handled again;
//   - replay: the group's offsets reset to the start, every record is
//     consumed again within the guard's window and none is handled again.
//
// Without the guard the AtLeastOnce scope handles a repeated record again
// (at least once, not once), so these three rows are not applicable: their
// Result says so, and to set Config.Dedupe. Nor is the crash window the
// guard leaves checked (a crash after a handler's effect and before its
// identity is remembered: docs/dedupe.md). Out-of-order versions are never
// applicable: the AtLeastOnce scope checks no per-key versions.
//
// The kit writes each record's message id in the header that the
// configuration's Identity reads (consumer.DefaultMessageIDHeader unless
// Identity.Header names another), and counts the handler's calls per
// message id: a record handled again although none of its calls failed
// fails the scenario (Result.Repeats). It needs no PostgreSQL.
//
// AtLeastOnce fails t at once when p lacks Valid, or has not exactly one
// of Handler and BatchHandler.
func AtLeastOnce(t *testing.T, p AtLeastOncePipeline) Report {
	t.Helper()
	if (p.Handler == nil) == (p.BatchHandler == nil) || p.Valid == nil {
		t.Fatalf("kscopetest: AtLeastOncePipeline needs Valid and one of Handler and BatchHandler to run the scenarios")
	}
	guarded := p.Config != nil && p.Config(consumer.Config{}).Dedupe.Store != nil
	return table(t, scenarios, func(t *testing.T) pipeline { return atLeastOncePipeline(t, p, guarded) })
}

// atLeastOnceNot says why a scenario does not apply to an AtLeastOnce
// pipeline, guarded or not ("" when it does).
func atLeastOnceNot(scenario string, guarded bool) string {
	var repeat string
	switch scenario {
	case "out_of_order_versions":
		return "the AtLeastOnce scope checks no per-key versions (dbscope.Options.Versions and txn.Options.Versions do)"
	case "duplicate_delivery_skipped":
		repeat = "an upstream duplicate (the same message id sent twice)"
	case "crash_before_offset_commit":
		repeat = "the records redelivered after a crash before their offsets committed"
	case "replay_no_new_effects":
		repeat = "every record of a replay (the group's offsets reset to the start)"
	default:
		return ""
	}
	if guarded {
		return ""
	}
	return "the pipeline's consumer.Config.Dedupe has no Store: the AtLeastOnce scope then handles again " + repeat +
		" (at least once, not once); set Config.Dedupe.Store (dedupe.NewMemory, dedupe.NewPostgres, redisstore.New) in " +
		"AtLeastOncePipeline.Config to have the kit check that it is not handled again"
}

// atLeastOncePipeline is p for one scenario: its effects counted from the
// scenario's start.
func atLeastOncePipeline(t *testing.T, p AtLeastOncePipeline, guarded bool) pipeline {
	var succeeded atomic.Int64 // the handler's calls that returned nil
	effects := func(context.Context) (int, error) { return int(succeeded.Load()), nil }
	if p.Effects != nil {
		base, err := p.Effects(context.Background())
		if err != nil {
			t.Fatalf("kscopetest: the pipeline's Effects: %v", err)
		}
		effects = func(ctx context.Context) (int, error) {
			n, err := p.Effects(ctx)
			return n - base, err
		}
	}
	what := "consumer.New"
	if p.BatchHandler != nil {
		what = "consumer.NewBatch"
	}
	return pipeline{
		valid: p.Valid, undecodable: p.Undecodable, config: p.Config, what: what,
		effects:    effects,
		duplicates: func(st consumer.Stats) int64 { return st.Dedupe.Hits },
		applies:    func(scenario string) string { return atLeastOnceNot(scenario, guarded) },
		build: func(cfg consumer.Config, f *Faults) (kitRunner, error) {
			if p.BatchHandler != nil {
				return atLeastOnceBatch(cfg, p.BatchHandler, f, &succeeded)
			}
			r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
				err := f.Call(r, func() error { return p.Handler.Handle(ctx, r) })
				if err == nil {
					succeeded.Add(1)
				}
				return err
			}))
			if err != nil {
				return nil, err
			}
			return r, nil
		},
	}
}

// atLeastOnceBatch builds an AtLeastOnce runner of the batch handler h, its
// calls run through f; succeeded counts the records the calls succeeded
// with (all of a call's that returned nil, those before the failing one of
// a consumer.FailedAt).
func atLeastOnceBatch(cfg consumer.Config, h consumer.BatchHandler, f *Faults, succeeded *atomic.Int64) (kitRunner, error) {
	r, err := consumer.NewBatch(cfg, consumer.BatchHandlerFunc(func(ctx context.Context, recs []*consumer.Record) error {
		err := f.in.batch(recs, f.idHeader, false, func(recs []*consumer.Record) error { return h.HandleBatch(ctx, recs) })
		switch i, _, ok := consumer.FailedIndex(err); {
		case err == nil:
			succeeded.Add(int64(len(recs)))
		case ok:
			succeeded.Add(int64(i))
		}
		return err
	}))
	if err != nil {
		return nil, err
	}
	return r, nil
}
