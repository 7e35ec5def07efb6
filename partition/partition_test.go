package partition

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/commit"
)

func TestShardIsStablePerKeyAndSpreads(t *testing.T) {
	const shards = 16
	counts := make([]int, shards)
	for i := 0; i < 16000; i++ {
		key := []byte(fmt.Sprintf("account-%d", i))
		s := Shard("payments", int32(i%12), int64(i), key, shards, NullKeyOrdered)
		if again := Shard("payments", int32((i+5)%12), int64(i+99), key, shards, NullKeyOrdered); again != s {
			t.Fatalf("key %s went to shard %d then %d", key, s, again)
		}
		counts[s]++
	}
	for s, n := range counts {
		if n < 700 || n > 1300 {
			t.Fatalf("shard %d got %d of 16000 keys; routing does not spread: %v", s, n, counts)
		}
	}
	if Shard("a", 0, 0, []byte("k"), shards, NullKeyOrdered) == Shard("b", 0, 0, []byte("k"), shards, NullKeyOrdered) &&
		Shard("a", 0, 0, []byte("k2"), shards, NullKeyOrdered) == Shard("b", 0, 0, []byte("k2"), shards, NullKeyOrdered) &&
		Shard("a", 0, 0, []byte("k3"), shards, NullKeyOrdered) == Shard("b", 0, 0, []byte("k3"), shards, NullKeyOrdered) {
		t.Fatal("the topic does not take part in routing")
	}
}

func TestNullKeyPolicies(t *testing.T) {
	first := Shard("t", 3, 0, nil, 32, NullKeyOrdered)
	spread := map[int]bool{}
	for off := int64(0); off < 500; off++ {
		if s := Shard("t", 3, off, nil, 32, NullKeyOrdered); s != first {
			t.Fatalf("NullKeyOrdered: offset %d went to shard %d, not %d", off, s, first)
		}
		spread[Shard("t", 3, off, nil, 32, NullKeySpread)] = true
	}
	if len(spread) < 24 {
		t.Fatalf("NullKeySpread used %d of 32 shards", len(spread))
	}
	// An empty key is a key, not a null key.
	_ = Shard("t", 3, 0, []byte{}, 32, NullKeyOrdered)
}

func BenchmarkShard(b *testing.B) {
	key := []byte("account-123456789")
	b.ReportAllocs()
	for i := range b.N {
		Shard("payments.captured", int32(i&7), int64(i), key, 64, NullKeyOrdered)
	}
}

func newTestAssignment(p int32) *Assignment {
	return NewAssignment(context.Background(), commit.NewPartition("t", p))
}

func TestPoolSerialPerShardInOrder(t *testing.T) {
	t.Run("Dispatch", func(t *testing.T) { testPoolSerialPerShardInOrder(t, false) })
	t.Run("DispatchAll", func(t *testing.T) { testPoolSerialPerShardInOrder(t, true) })
}

// testPoolSerialPerShardInOrder dispatches 2000 values over 4 shards one by
// one, or in per-shard runs as the runner does with a poll's records.
func testPoolSerialPerShardInOrder(t *testing.T, all bool) {
	var mu sync.Mutex
	got := map[int][]int{}
	var active [4]atomic.Int32
	var overlap atomic.Bool
	var wg sync.WaitGroup
	p := NewPool(PoolConfig[int]{
		Shards: 4,
		Process: func(_ context.Context, _ *Assignment, batch []int) {
			for _, v := range batch {
				s := v % 4
				if active[s].Add(1) != 1 {
					overlap.Store(true)
				}
				time.Sleep(time.Microsecond)
				mu.Lock()
				got[s] = append(got[s], v)
				mu.Unlock()
				active[s].Add(-1)
				wg.Done()
			}
		},
	})
	p.Start()
	a := newTestAssignment(0)
	wg.Add(2000)
	if all {
		for lo := 0; lo < 2000; lo += 100 {
			var runs [4][]int
			for v := lo; v < lo+100; v++ {
				runs[v%4] = append(runs[v%4], v)
			}
			for s, run := range runs {
				p.DispatchAll(s, a, run)
			}
		}
	} else {
		for v := 0; v < 2000; v++ {
			p.Dispatch(v%4, a, v)
		}
	}
	wg.Wait()
	p.Stop()
	if overlap.Load() {
		t.Fatal("two batches of one shard ran at once")
	}
	for s, vs := range got {
		for i := 1; i < len(vs); i++ {
			if vs[i] < vs[i-1] {
				t.Fatalf("shard %d out of order: %d after %d", s, vs[i], vs[i-1])
			}
		}
		if len(vs) != 500 {
			t.Fatalf("shard %d handled %d, want 500", s, len(vs))
		}
	}
}

func TestPoolBatchesOnePartitionAtATime(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var batches [][]int
	var parts []int32
	done := make(chan struct{}, 100)
	entered := make(chan struct{}, 100)
	p := NewPool(PoolConfig[int]{
		Shards:   1,
		BatchMax: 3,
		Process: func(_ context.Context, a *Assignment, batch []int) {
			entered <- struct{}{}
			<-release
			mu.Lock()
			batches = append(batches, append([]int(nil), batch...))
			parts = append(parts, a.Partition)
			mu.Unlock()
			done <- struct{}{}
		},
	})
	p.Start()
	a0, a1 := newTestAssignment(0), newTestAssignment(1)
	p.Dispatch(0, a0, 0) // taken alone while the rest is queued
	<-entered
	for v, a := range []*Assignment{a0, a0, a0, a0, a1, a1, a0} {
		p.Dispatch(0, a, v+1)
	}
	close(release)
	for range 4 {
		<-done
	}
	p.Stop()
	// 7 joins 4, past partition 1's records, which keep their turn.
	want := [][]int{{0}, {1, 2, 3}, {4, 7}, {5, 6}}
	if fmt.Sprint(batches) != fmt.Sprint(want) || fmt.Sprint(parts) != "[0 0 0 1]" {
		t.Fatalf("batches %v of partitions %v, want %v of [0 0 0 1]", batches, parts, want)
	}
}

// A shard's queue interleaves partitions' runs, a run per poll: a batch
// gathers its partition's records from the runs behind the first, in
// order, and the records it passes keep theirs.
func TestPoolGathersAPartitionsRunsIntoOneBatch(t *testing.T) {
	release := make(chan struct{})
	var batches [][]int
	done := make(chan struct{}, 100)
	entered := make(chan struct{}, 100)
	p := NewPool(PoolConfig[int]{
		Shards:   1,
		BatchMax: 4,
		Process: func(_ context.Context, a *Assignment, batch []int) {
			entered <- struct{}{}
			<-release
			batches = append(batches, append([]int(nil), batch...))
			done <- struct{}{}
		},
	})
	p.Start()
	a0, a1, a2 := newTestAssignment(0), newTestAssignment(1), newTestAssignment(2)
	p.Dispatch(0, a2, 0) // taken alone while the rest is queued
	<-entered
	p.DispatchAll(0, a0, []int{1})
	p.DispatchAll(0, a1, []int{10})
	p.DispatchAll(0, a0, []int{2})
	p.DispatchAll(0, a1, []int{11})
	p.DispatchAll(0, a0, []int{3})
	p.DispatchAll(0, a2, []int{20})
	p.DispatchAll(0, a0, []int{4, 5})
	p.DispatchAll(0, a1, []int{12})
	close(release)
	for range 5 {
		<-done
	}
	p.Stop()
	want := [][]int{{0}, {1, 2, 3, 4}, {10, 11, 12}, {20}, {5}}
	if fmt.Sprint(batches) != fmt.Sprint(want) {
		t.Fatalf("batches %v, want %v", batches, want)
	}
}

func TestPoolPurgeAndStopDropQueued(t *testing.T) {
	block := make(chan struct{})
	started := make(chan struct{})
	var processed, dropped atomic.Int64
	p := NewPool(PoolConfig[int]{
		Shards: 1,
		Process: func(_ context.Context, a *Assignment, batch []int) {
			if batch[0] == 0 {
				close(started)
				<-block
			}
			processed.Add(int64(len(batch)))
		},
		Drop: func(*Assignment, int) { dropped.Add(1) },
	})
	p.Start()
	a, b := newTestAssignment(0), newTestAssignment(1)
	p.Dispatch(0, a, 0)
	<-started
	for v := 1; v <= 10; v++ {
		p.Dispatch(0, a, v)
		p.Dispatch(0, b, 100+v)
	}
	a.Revoke()
	p.Purge(a)
	if dropped.Load() != 10 {
		t.Fatalf("purge dropped %d, want the 10 queued records of the revoked assignment", dropped.Load())
	}
	if a.Running() != 1 {
		t.Fatalf("running %d, want the 1 record already taken", a.Running())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	if err := a.WaitIdle(ctx); err == nil {
		t.Fatal("WaitIdle returned while a record was running")
	}
	cancel()
	p.Dispatch(0, a, 99) // after revoke: dropped at once
	if dropped.Load() != 11 {
		t.Fatal("a record dispatched for a revoked assignment was queued")
	}
	go close(block)
	if err := a.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	p.Stop() // idempotent
	if got := processed.Load() + dropped.Load(); got != 22 {
		t.Fatalf("processed+dropped = %d, want all 22 accounted for", got)
	}
}

// Runs of many partitions dispatched at random over the shards, as polls
// lay them out, while the workers take batches: each record is processed
// once, each partition's records on a shard in the order dispatched, and a
// batch holds one partition's records.
func TestPoolKeepsEachPartitionsOrderAcrossGatheredBatches(t *testing.T) {
	const shards, parts, perPart = 3, 5, 3000
	var mu sync.Mutex
	got := map[[2]int][]int{} // shard, partition: values in processing order
	var processed atomic.Int64
	all := make(chan struct{})
	var mixed atomic.Bool
	p := NewPool(PoolConfig[int]{
		Shards:   shards,
		BatchMax: 16,
		Process: func(_ context.Context, a *Assignment, batch []int) {
			mu.Lock()
			for _, v := range batch {
				if int32(v/perPart) != a.Partition {
					mixed.Store(true)
				}
				k := [2]int{v % shards, v / perPart}
				got[k] = append(got[k], v)
			}
			mu.Unlock()
			if processed.Add(int64(len(batch))) == parts*perPart {
				close(all)
			}
		},
	})
	p.Start()
	as := make([]*Assignment, parts)
	for i := range as {
		as[i] = newTestAssignment(int32(i))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	next := make([]int, parts) // the next value of each partition
	for left := parts * perPart; left > 0; {
		pt := rng.IntN(parts)
		n := min(1+rng.IntN(40), perPart-next[pt])
		runs := make([][]int, shards)
		for range n {
			v := pt*perPart + next[pt]
			next[pt]++
			runs[v%shards] = append(runs[v%shards], v)
		}
		for s, run := range runs {
			if len(run) > 0 {
				p.DispatchAll(s, as[pt], run)
			}
		}
		left -= n
	}
	select {
	case <-all:
	case <-time.After(time.Minute):
		t.Fatalf("%d of %d records processed", processed.Load(), parts*perPart)
	}
	p.Stop()
	if mixed.Load() {
		t.Fatal("a batch held records of two partitions")
	}
	for k, vs := range got {
		for i := 1; i < len(vs); i++ {
			if vs[i] <= vs[i-1] {
				t.Fatalf("shard %d, partition %d: %d after %d", k[0], k[1], vs[i], vs[i-1])
			}
		}
	}
	total := 0
	for _, vs := range got {
		total += len(vs)
	}
	if total != parts*perPart {
		t.Fatalf("%d records processed, want %d", total, parts*perPart)
	}
}
