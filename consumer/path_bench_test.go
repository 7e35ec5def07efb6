package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkDispatchToDone measures the runner's whole path for a record of
// the AtLeastOnce scope with a handler that does nothing: one poll's
// records of a partition routed to their key-shards (dispatchAll), run by
// the workers, reported done and marked in the partition's watermark. Run
// with -cpu 1, the figure is the CPU the runner spends per record (r1's
// distance to the raw loop); with more, the hand-off between cores too.
func BenchmarkDispatchToDone(b *testing.B) {
	const poll = 4096 // about one fetch's share of a partition in r1
	r, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, Logger: slog.New(slog.DiscardHandler)},
		HandlerFunc(func(context.Context, *Record) error { return nil }))
	if err != nil {
		b.Fatal(err)
	}
	r.hardCtx = context.Background()
	r.shardBuf = make([][]*Record, r.cfg.Shards)
	r.newPool()
	f := &failures{policy: r.cfg.Failures, group: r.cfg.Group, identity: r.cfg.Identity, log: r.log, obs: r.obs}
	r.unit.(*atLeastOnce).bind(f)
	r.failures = f
	r.pool.Start()
	defer r.pool.Stop()
	r.onAssigned(context.Background(), nil, map[string][]int32{"t": {0}})

	keys := make([][]byte, 10000)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%05d", i)
	}
	recs := make([]*kgo.Record, poll)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: "t", Partition: 0, Key: keys[(i*7919)%len(keys)], Value: make([]byte, 200)}
	}
	var offset int64
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for _, rec := range recs {
			rec.Offset = offset
			offset++
		}
		want := r.done.Load() + poll
		r.dispatchAll("t", 0, offset, recs)
		for r.done.Load() < want {
			runtime.Gosched()
		}
		r.flushDone()
		r.tracker.Get("t", 0).Committable()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*poll), "ns/record")
}
