package commit

import (
	"math/rand/v2"
	"testing"
)

func TestWatermarkWaitsForLowestUnfinished(t *testing.T) {
	p := NewPartition("t", 0)
	for _, o := range []int64{10, 11, 12, 15, 16} { // gaps: compaction, txn markers
		if !p.Add(o, 3) {
			t.Fatalf("Add(%d) refused", o)
		}
	}
	if _, ok := p.Committable(); ok {
		t.Fatal("committable before anything finished")
	}
	p.Done(12)
	p.Done(16)
	if _, ok := p.Committable(); ok {
		t.Fatal("committable while 10 is unfinished")
	}
	p.Done(10)
	if o, _ := p.Committable(); o.Offset != 11 || o.Epoch != 3 {
		t.Fatalf("committable %+v, want 11 (10 done, 11 not)", o)
	}
	p.Done(11)
	if o, _ := p.Committable(); o.Offset != 13 {
		t.Fatalf("committable %+v, want 13 (one past 12; 15 unfinished)", o)
	}
	p.Done(15)
	if o, _ := p.Committable(); o.Offset != 17 {
		t.Fatalf("committable %+v, want 17", o)
	}
	if p.Pending() != 0 {
		t.Fatalf("pending %d, want 0", p.Pending())
	}
}

func TestWatermarkIgnoresRepeatsUnknownAndDetached(t *testing.T) {
	p := NewPartition("t", 0)
	p.Add(1, 0)
	p.Add(2, 0)
	if p.Add(2, 0) || p.Add(0, 0) {
		t.Fatal("Add accepted an offset at or below the last one")
	}
	if p.Done(7) {
		t.Fatal("Done accepted an offset never added")
	}
	if !p.Done(1) || p.Done(1) {
		t.Fatal("Done(1) twice: want true then false")
	}
	o, _ := p.Detach()
	if o.Offset != 2 {
		t.Fatalf("Detach returned %d, want 2", o.Offset)
	}
	if p.Done(2) {
		t.Fatal("Done after Detach changed a detached assignment")
	}
	if o, _ := p.Committable(); o.Offset != 2 {
		t.Fatalf("a late completion moved a detached watermark to %d", o.Offset)
	}
}

// checkWatermark finishes the offsets of p in a random order and checks after
// every step that the committable offset is exactly one past the finished
// prefix: never beyond an unfinished offset, never behind a finished prefix.
//
// With batched, offsets are added with AddAll in chunks (each chunk starting
// with a few offsets added before, which AddAll must skip) and finished with
// DoneAll in chunks, as the runner does.
func checkWatermark(t *testing.T, rng *rand.Rand, n int, batched bool) {
	p := NewPartition("t", 0)
	offsets := make([]int64, n)
	var o int64
	for i := range offsets {
		o += 1 + int64(rng.IntN(3))
		offsets[i] = o
		if !batched {
			p.Add(o, 0)
		}
	}
	for lo := 0; batched && lo < n; {
		hi := min(n, lo+1+rng.IntN(300))
		from := max(0, lo-rng.IntN(4)) // a repeat of already added offsets
		chunk := offsets[from:hi]
		if first := p.AddAll(len(chunk), func(i int) (int64, int32, int64) { return chunk[i], 0, 0 }); first != lo-from {
			t.Fatalf("AddAll of offsets[%d:%d] added from index %d, want %d", from, hi, first, lo-from)
		}
		lo = hi
	}
	if p.Pending() != n {
		t.Fatalf("pending %d after adding %d offsets", p.Pending(), n)
	}
	done := make([]bool, n)
	perm := rng.Perm(n)
	for len(perm) > 0 {
		k := 1
		if batched {
			k = min(len(perm), 1+rng.IntN(64))
		}
		var chunk []int64
		for _, i := range perm[:k] {
			chunk = append(chunk, offsets[i])
			done[i] = true
		}
		perm = perm[k:]
		if batched {
			if got := p.DoneAll(append(chunk, chunk[0])); got != k { // a repeat is not counted
				t.Fatalf("DoneAll counted %d of %d new offsets", got, k)
			}
		} else {
			p.Done(chunk[0])
		}
		prefix := 0
		for prefix < n && done[prefix] {
			prefix++
		}
		got, ok := p.Committable()
		switch {
		case prefix == 0 && ok:
			t.Fatalf("committable %d with offset %d unfinished", got.Offset, offsets[0])
		case prefix > 0 && (!ok || got.Offset != offsets[prefix-1]+1):
			t.Fatalf("committable %+v (ok=%v), want %d", got, ok, offsets[prefix-1]+1)
		}
		if prefix < n && ok && got.Offset > offsets[prefix] {
			t.Fatalf("committable %d passes unfinished offset %d", got.Offset, offsets[prefix])
		}
	}
}

func TestWatermarkProperty(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, seed*7+1))
		checkWatermark(t, rng, 1+rng.IntN(3000), seed%2 == 1)
	}
}

func FuzzWatermark(f *testing.F) {
	f.Add(uint64(1), uint16(10))
	f.Add(uint64(42), uint16(2000))
	f.Fuzz(func(t *testing.T, seed uint64, n uint16) {
		checkWatermark(t, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), 1+int(n%5000), seed%2 == 1)
	})
}

// Interleaved adds and completions, as the poll loop and workers produce
// them, with the slice compaction that a long-lived partition goes through.
func TestWatermarkStreaming(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	p := NewPartition("t", 0)
	var next int64
	var open []int64
	for step := 0; step < 200_000; step++ {
		if len(open) < 50 && rng.IntN(2) == 0 {
			p.Add(next, 0)
			open = append(open, next)
			next++
			continue
		}
		if len(open) == 0 {
			continue
		}
		i := rng.IntN(min(len(open), 8))
		p.Done(open[i])
		open = append(open[:i], open[i+1:]...)
		o, ok := p.Committable()
		if len(open) > 0 && ok && o.Offset > open[0] {
			t.Fatalf("step %d: committable %d passes unfinished %d", step, o.Offset, open[0])
		}
		if len(open) == 0 && o.Offset != next {
			t.Fatalf("step %d: all finished but committable %d, want %d", step, o.Offset, next)
		}
	}
}

func BenchmarkWatermarkAddDone(b *testing.B) {
	p := NewPartition("t", 0)
	// 16 records in flight; every offset finishes once, in a scrambled
	// order within groups of four, so the watermark keeps advancing.
	scramble := [4]int64{2, 0, 3, 1}
	b.ReportAllocs()
	for i := range int64(b.N) {
		p.Add(i, 0)
		if j := i - 16; j >= 0 {
			p.Done(j&^3 + scramble[j&3])
		}
	}
}

// BenchmarkWatermarkAddAllDoneAll is the runner's path: a poll's records of
// a partition added under one lock, a worker's batch finished under one.
func BenchmarkWatermarkAddAllDoneAll(b *testing.B) {
	p := NewPartition("t", 0)
	const chunk = 64
	offs := make([]int64, chunk)
	b.ReportAllocs()
	var next int64
	for b.Loop() {
		base := next
		p.AddAll(chunk, func(i int) (int64, int32, int64) { return base + int64(i), 0, 0 })
		for i := range offs {
			offs[i] = base + int64(chunk-1-i) // finished out of order
		}
		p.DoneAll(offs)
		next += chunk
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunk), "ns/record")
}

// One record stuck at the head while millions behind it finish: the
// watermark keeps memory for the unfinished records, not for every
// finished one, and still commits exactly up to the stuck record, then
// past everything once it finishes.
func TestWatermarkMemoryBoundedWhileHeadStuck(t *testing.T) {
	p := NewPartition("t", 0)
	p.AddAll(1, func(int) (int64, int32, int64) { return 0, 1, 0 }) // stuck
	const chunk, total = 512, 2_000_000
	offs := make([]int64, chunk)
	var open []int64
	next := int64(1)
	for next < total {
		base := next
		p.AddAll(chunk, func(i int) (int64, int32, int64) { return base + int64(i), 2, 0 })
		// finish the chunk out of order, leaving every 10,000th record
		// of it open until the next chunk
		n := 0
		for i := chunk - 1; i >= 0; i-- {
			if o := base + int64(i); o%10_000 == 0 {
				open = append(open, o)
			} else {
				offs[n] = o
				n++
			}
		}
		p.DoneAll(offs[:n])
		if len(open) > 0 && base > open[0]+chunk {
			p.Done(open[0])
			open = open[1:]
		}
		next += chunk
		if o, _ := p.Committable(); o.Offset > 0 {
			t.Fatalf("committable %d passes the stuck offset 0", o.Offset)
		}
	}
	p.mu.Lock()
	size := cap(p.entries)
	p.mu.Unlock()
	if size > 16_384 {
		t.Fatalf("%d entries kept for %d outstanding records behind a stuck head", size, p.Pending())
	}
	for _, o := range open {
		p.Done(o)
	}
	if p.Done(5) || p.Done(0) == false {
		t.Fatal("a finished offset inside a run was accepted again, or the stuck one refused")
	}
	if o, ok := p.Committable(); !ok || o.Offset != next || o.Epoch != 2 || p.Pending() != 0 {
		t.Fatalf("after the head finished: committable %+v (pending %d), want %d epoch 2", o, p.Pending(), next)
	}
}
