package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
)

// observeAll runs every Observer call of a delivery's hot path.
func observeAll(obs *consumer.Observer, r *consumer.Record, out *kgo.Record, err error) {
	ctx := obs.Start(context.Background(), r)
	obs.Event(r, hook.EventRetry, "")
	obs.Inject(obs.Context(ctx, r), out)
	obs.Route(hook.Route{Topic: "orders", Kind: "dlt", Class: "terminal", Target: "g.kscope-dlt", Err: err})
	obs.End(r, hook.OutcomeSuccess, err)
	obs.Fetched("orders", 0, 10)
	obs.Commit(3, nil)
	obs.Lag(hook.Lag{Topic: "orders", Offsets: 5})
	obs.Lateness("orders", time.Millisecond)
}

// With no hooks configured, observability costs the hot path no
// allocation.
func TestNoHooksNoAllocations(t *testing.T) {
	obs := consumer.NewObserver("g", nil)
	r := &consumer.Record{Record: &kgo.Record{Topic: "orders", Key: []byte("k")}}
	out := &kgo.Record{Topic: "g.kscope-dlt"}
	err := errors.New("boom")
	if n := testing.AllocsPerRun(1000, func() { observeAll(obs, r, out, err) }); n != 0 {
		t.Fatalf("%v allocations per delivery with no hooks, want 0", n)
	}
}

func BenchmarkObserverNoHooks(b *testing.B) {
	obs := consumer.NewObserver("g", nil)
	r := &consumer.Record{Record: &kgo.Record{Topic: "orders", Key: []byte("k")}}
	out := &kgo.Record{Topic: "g.kscope-dlt"}
	b.ReportAllocs()
	for b.Loop() {
		observeAll(obs, r, out, nil)
	}
}

type recordHook struct{ starts, ends int }

func (h *recordHook) OnRecordStart(ctx context.Context, _ hook.RecordStart) context.Context {
	h.starts++
	return context.WithValue(ctx, h, h.starts)
}

func (h *recordHook) OnRecordEnd(context.Context, hook.RecordEnd) { h.ends++ }

// A hook is found by the interfaces it implements; a delivery ends once.
func TestHooksAreFoundByInterface(t *testing.T) {
	h := &recordHook{}
	obs := consumer.NewObserver("g", []hook.Hook{h, "not a hook"})
	r := &consumer.Record{Record: &kgo.Record{Topic: "orders"}}
	ctx := obs.Start(context.Background(), r)
	if ctx.Value(h) != 1 || obs.Context(context.Background(), r) != ctx {
		t.Fatal("the delivery's context is not the one the hook returned")
	}
	obs.End(r, hook.OutcomeSuccess, nil)
	obs.End(r, hook.OutcomeAborted, nil)
	if h.starts != 1 || h.ends != 1 {
		t.Fatalf("starts %d, ends %d; want 1 and 1", h.starts, h.ends)
	}
}
