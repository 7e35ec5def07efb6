package hook_test

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
)

// deadLetters counts the deliveries that ended in the dead-letter topic
// and logs each with its error: an observer implements only the hook
// interfaces it needs.
type deadLetters struct{ n atomic.Int64 }

func (d *deadLetters) OnRecordStart(ctx context.Context, _ hook.RecordStart) context.Context {
	return ctx
}

func (d *deadLetters) OnRecordEnd(_ context.Context, e hook.RecordEnd) {
	if e.Outcome == hook.OutcomeDeadLettered {
		d.n.Add(1)
		slog.Warn("dead-lettered", "topic", e.Record.Topic, "partition", e.Record.Partition, "offset", e.Record.Offset, "err", e.Err)
	}
}

var _ hook.RecordHook = (*deadLetters)(nil)

// An observer of your own goes into Config.Hooks, next to kscopeprom's and
// kscopeotel's.
func ExampleRecordHook() {
	dl := &deadLetters{}
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "payments", Topics: []string{"payments"}}
	cfg.Hooks = []hook.Hook{dl}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		return nil
	}))
	if err != nil {
		panic(err)
	}
	_ = r.Run(context.Background())
}

// poison pages on the dead letters that no retry can heal: a payload that
// cannot be decoded or names a schema the reader cannot use.
type poison struct{ n atomic.Int64 }

func (p *poison) OnRoute(r hook.Route) {
	if r.Kind != "dlt" || r.Err != nil {
		return
	}
	switch r.Reason {
	case hook.ReasonDeserializationFailure, hook.ReasonSchemaIncompatible:
		p.n.Add(1)
		slog.Error("poison record dead-lettered", "topic", r.Topic, "dlt", r.Target, "reason", r.Reason)
	}
}

// A RouteHook reads why a record went to the dead-letter topic from
// Route.Reason.
func ExampleRouteHook() {
	p := &poison{}
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "payments", Topics: []string{"payments"}, Hooks: []hook.Hook{p}}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		return nil
	}))
	if err != nil {
		panic(err)
	}
	_ = r.Run(context.Background())
}
