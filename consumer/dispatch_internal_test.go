package consumer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/partition"
)

// recordingScope keeps every batch it is given, in the order its worker
// ran them, and finishes each record.
type recordingScope struct {
	mu      sync.Mutex
	batches [][]*Record
	all     sync.WaitGroup
}

func (s *recordingScope) Process(_ context.Context, batch []*Record, done func(*Record)) {
	s.mu.Lock()
	s.batches = append(s.batches, append([]*Record(nil), batch...))
	s.mu.Unlock()
	for _, r := range batch {
		done(r)
		s.all.Done()
	}
}

func (s *recordingScope) BatchLimits() (int, time.Duration) { return 8, 0 }

// One poll's records of a partition reach each key-shard in offset order
// (per-key order), and each key-shard's records sit together in memory, in
// that order: a worker walks consecutive records rather than one every few
// hundred bytes (the layout r1's benchmark measures).
func TestDispatchKeepsOffsetOrderAndLaysEachShardOutTogether(t *testing.T) {
	const shards, n = 4, 500
	sc := &recordingScope{}
	r, err := newRunner(Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, Shards: shards}.WithDefaults(), sc)
	if err != nil {
		t.Fatal(err)
	}
	r.hardCtx = context.Background()
	r.shardBuf = make([][]*Record, shards)
	r.newPool()
	r.pool.Start()
	defer r.pool.Stop()
	r.onAssigned(context.Background(), nil, map[string][]int32{"t": {0}})

	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: "t", Partition: 0, Offset: int64(100 + i), Key: fmt.Appendf(nil, "key-%d", i%37), Value: []byte("v")}
	}
	sc.all.Add(n)
	if got, _ := r.dispatchAll("t", 0, 600, recs); got != n {
		t.Fatalf("dispatchAll took %d of %d records", got, n)
	}
	sc.all.Wait()

	th := partition.HashTopic("t")
	byShard := make([][]*Record, shards)
	for _, b := range sc.batches {
		for _, rec := range b {
			want := th.Shard(0, rec.Offset, rec.Key, shards, r.cfg.NullKeys)
			if int(rec.shard) != want {
				t.Fatalf("offset %d ran on shard %d; its key routes to %d", rec.Offset, rec.shard, want)
			}
			if rec.offset != rec.Offset {
				t.Fatalf("record at offset %d carries offset %d for its done report", rec.Offset, rec.offset)
			}
			byShard[want] = append(byShard[want], rec)
		}
	}
	size := unsafe.Sizeof(Record{})
	total := 0
	for s, rs := range byShard {
		total += len(rs)
		for i := 1; i < len(rs); i++ {
			if rs[i].Offset <= rs[i-1].Offset {
				t.Fatalf("shard %d ran offset %d after %d", s, rs[i].Offset, rs[i-1].Offset)
			}
			if gap := uintptr(unsafe.Pointer(rs[i])) - uintptr(unsafe.Pointer(rs[i-1])); gap != size {
				t.Fatalf("shard %d's records at offsets %d and %d are %d bytes apart; want adjacent (%d)", s, rs[i-1].Offset, rs[i].Offset, gap, size)
			}
		}
	}
	if total != n {
		t.Fatalf("%d records ran; want %d", total, n)
	}
	r.flushDone()
	if c, ok := r.tracker.Get("t", 0).Committable(); !ok || c.Offset != 600 {
		t.Fatalf("committable offset %v (%v) after every record finished; want 600", c, ok)
	}
}
