package kscopetest

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
)

// ScopePipeline describes to the kit a pipeline on a scope of the
// service's own, built on the contract of package scope and run by
// consumer.NewScoped, that keeps its effects in a store of type S (a
// database handle, a file). The kit expects of it what the DB scope
// guarantees: each record's effect is applied once in the store, across
// duplicates, crashes and replays (an inbox of record identities, written
// with the effect), and failures follow the runner's failure policy.
type ScopePipeline[S any] struct {
	// Open opens a fresh, empty store for one scenario and returns it,
	// closing it when t ends (t.Cleanup). The kit calls it once per
	// scenario; the scenario's runners (two, one after the other, in a
	// crash and a replay) run on the same store.
	Open func(t *testing.T) S
	// Runner builds the scope's runner on store with cfg, the kit's
	// consumer configuration (its brokers, group and topic, a fast failure
	// policy, and Config's adjustments), passed on unchanged. The scope's
	// handler runs each record's work through f.Call and returns its
	// error, so that the kit counts the handler's calls per message id and
	// injects a scenario's failures (retryable, non-retryable, poison)
	// where the service's own would arise.
	Runner func(store S, cfg consumer.Config, f *Faults) (*consumer.Runner, error)
	// Config, when not nil, adjusts the consumer configuration the kit
	// builds (brokers, group and topic are the kit's).
	Config func(consumer.Config) consumer.Config
	// Valid returns the i-th well-formed input record (value and any
	// headers; the kit sets topic, key and message id).
	Valid func(i int) *kgo.Record
	// Undecodable returns a record the handler rejects as poison
	// (consumer.DecodeError). Nil skips that scenario.
	Undecodable func() *kgo.Record
	// Effects counts the effects in store (the entries the handler
	// wrote). Give the service's handler an effect that a second
	// application would show, such as an entry appended per record: one
	// that overwrites the same entry hides a duplicate from the kit.
	Effects func(ctx context.Context, store S) (int, error)
}

// Scope runs the delivery-semantics table against p, a pipeline on a
// scope of the service's own, and returns the report; each failing
// scenario also fails its subtest of t. It runs the scenarios of [DB] that
// apply to any scope: success then commit, duplicate delivery, crash
// before the offset commit, retryable failure, non-retryable failure,
// undecodable record, poison, batch partial failure and replay. Out-of-order
// versions, which need the DB scope's Options.Versions, are not run. The
// duplicate and replay scenarios check that the handler did not run again
// for a record whose effect the store holds, not the runner's counters: a
// scope's own counters (scope.StatsReporter) are its own.
//
// Scope fails t at once when p lacks Open, Runner, Valid or Effects.
func Scope[S any](t *testing.T, p ScopePipeline[S]) Report {
	t.Helper()
	for _, f := range []struct {
		missing bool
		name    string
	}{{p.Open == nil, "Open"}, {p.Runner == nil, "Runner"}, {p.Valid == nil, "Valid"}, {p.Effects == nil, "Effects"}} {
		if f.missing {
			t.Fatalf("kscopetest: ScopePipeline.%s is nil; the kit needs it to run the scenarios", f.name)
		}
	}
	return table(t, scopeScenarios(), func(t *testing.T) pipeline { return scopePipeline(t, p) })
}

// scopePipeline opens p's store for one scenario.
func scopePipeline[S any](t *testing.T, p ScopePipeline[S]) pipeline {
	store := p.Open(t)
	return pipeline{
		valid: p.Valid, undecodable: p.Undecodable, config: p.Config, what: "ScopePipeline.Runner",
		effects: func(ctx context.Context) (int, error) { return p.Effects(ctx, store) },
		build: func(cfg consumer.Config, f *Faults) (kitRunner, error) {
			r, err := p.Runner(store, cfg, f)
			if r == nil || err != nil {
				return nil, err
			}
			return r, nil
		},
	}
}
