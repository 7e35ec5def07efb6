package txn

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkGuardPerInput measures the idempotency guard's own work per
// input in one partition's state that holds DefaultDedupeMaxIDs
// identities: the lookup, the remembering, and its share of a
// transaction's end (segments of 1,000 inputs, the oldest forgotten).
func BenchmarkGuardPerInput(b *testing.B) {
	pv := newPartVersions()
	ids := make([]string, DefaultDedupeMaxIDs+b.N)
	for i := range ids {
		ids[i] = "bench.in/3/" + strconv.Itoa(i)
	}
	key := func(i int) idKey { return keyOfID([]byte(ids[i])) }
	now := time.Now()
	fill := func(from, to int) {
		for i := from; i < to; i++ {
			pv.rememberID(key(i))
			if (i+1)%1000 == 0 {
				pv.writeIDs(now, time.Hour, DefaultDedupeMaxIDs)
				pv.end(true)
			}
		}
	}
	fill(0, DefaultDedupeMaxIDs)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		id := key(DefaultDedupeMaxIDs + i)
		if pv.seenID(id, time.Hour) {
			b.Fatal("a new identity seen")
		}
		pv.rememberID(id)
		if (i+1)%1000 == 0 {
			pv.writeIDs(now, time.Hour, DefaultDedupeMaxIDs)
			pv.end(true)
		}
	}
}

// BenchmarkGuardPerInputParallel is BenchmarkGuardPerInput with the
// lookups and rememberings of one partition made by several key-shards at
// once, as the scope makes them: what the stripes' locks and their cache
// lines cost when two cores share a partition.
func BenchmarkGuardPerInputParallel(b *testing.B) {
	pv := newPartVersions()
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		var buf [32]byte
		for pb.Next() {
			i := next.Add(1)
			id := keyOfID(strconv.AppendInt(append(buf[:0], "bench.in/3/"...), i, 10))
			if pv.seenID(id, time.Hour) {
				b.Fatal("a new identity seen")
			}
			pv.rememberID(id)
		}
	})
}
