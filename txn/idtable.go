package txn

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"sync/atomic"
)

// idTable maps identity keys to the low 32 bits of their segment's
// sequence number: open addressing with linear probing over one array of
// 16-byte slots, the key and its number side by side, so that a lookup
// reads one cache line where a map of the runtime reads its group's
// control word and then the slot, often in two. A partition's identities
// do not fit the CPU's caches, so the line a lookup misses is most of
// the guard's cost per input (BenchmarkGuardPerInput).
//
// A slot keeps the first 12 bytes of the key (96 bits of SHA-256: with
// 100,000 identities remembered, a new one matches one of them by chance
// once in 10^24 lookups). A segment's number is kept modulo 2^32 and read
// against a reference of the same partition (seqAtLeast, seqFull): the
// numbers alive in a partition span far less than 2^31 (at most one
// segment an identity kept, and MaxIDs is validated below 2^30).
//
// Every method but touch runs under the stripe's lock. touch reads, with
// no lock, the line a key's lookup will read, so that a batch's misses
// overlap (idMemory.touch): it reads the slots through cur, and each
// slot's k0 atomically, which every write of a published slot's k0 is.
type idTable struct {
	slots []idSlot
	shift uint8  // 64 - log2(len(slots))
	seed  uint64 // odd, set once: a key's home slot is the top bits of its first word times seed
	n     int    // slots in use
	cur   atomic.Pointer[idSlots]
	// The all-zero key marks an empty slot; an identity whose key is
	// all zeros (a chance of 2^-96) is kept here.
	zero    bool
	zeroSeq uint32
}

type idSlot struct {
	k0  uint64 // written atomically once published (touch reads it)
	k1  uint32
	seq uint32
}

// idSlots is the slots and shift as touch reads them.
type idSlots struct {
	slots []idSlot
	shift uint8
}

// minTableSlots is the smallest table (256 bytes): a quiet partition's
// stripes stay small.
const minTableSlots = 16

// newIDTable returns a table with room for n keys before it grows.
func newIDTable(n int) *idTable {
	t := &idTable{seed: rand.Uint64() | 1}
	t.alloc(n)
	t.publish()
	return t
}

// alloc makes new slots for n keys at most three quarters full; publish
// makes them touch's.
func (t *idTable) alloc(n int) {
	size := max(minTableSlots, 1<<bits.Len(uint(n+n/3)))
	t.slots = make([]idSlot, size)
	t.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	t.n = 0
}

func (t *idTable) publish() { t.cur.Store(&idSlots{t.slots, t.shift}) }

// put writes slot i, which touch may read.
func (t *idTable) put(i uint64, s idSlot) {
	t.slots[i].k1, t.slots[i].seq = s.k1, s.seq
	atomic.StoreUint64(&t.slots[i].k0, s.k0)
}

// touch reads the line where id's lookup starts, with no lock, so that
// the lookup finds it in the CPU's caches. What it reads is not used: a
// writer may be changing it.
func (t *idTable) touch(id idKey) {
	v := t.cur.Load()
	k0 := binary.LittleEndian.Uint64(id[:8])
	atomic.LoadUint64(&v.slots[(k0*t.seed)>>v.shift].k0)
}

func splitKey(id idKey) (uint64, uint32) {
	return binary.LittleEndian.Uint64(id[:8]), binary.LittleEndian.Uint32(id[8:12])
}

func (t *idTable) home(k0 uint64) uint64 { return (k0 * t.seed) >> t.shift }

// len returns how many keys t holds.
func (t *idTable) len() int {
	if t.zero {
		return t.n + 1
	}
	return t.n
}

// find returns the index of k's slot, or of the empty slot that ends its
// probe.
func (t *idTable) find(k0 uint64, k1 uint32) (uint64, bool) {
	mask := uint64(len(t.slots) - 1)
	for i := t.home(k0); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.k0 == k0 && s.k1 == k1 {
			return i, true
		}
		if s.k0 == 0 && s.k1 == 0 {
			return i, false
		}
	}
}

// get returns the number kept for id.
func (t *idTable) get(id idKey) (uint32, bool) {
	k0, k1 := splitKey(id)
	if k0 == 0 && k1 == 0 {
		return t.zeroSeq, t.zero
	}
	i, ok := t.find(k0, k1)
	return t.slots[i].seq, ok
}

// set keeps seq for id.
func (t *idTable) set(id idKey, seq uint32) {
	k0, k1 := splitKey(id)
	if k0 == 0 && k1 == 0 {
		t.zero, t.zeroSeq = true, seq
		return
	}
	i, ok := t.find(k0, k1)
	if ok {
		t.slots[i].seq = seq
		return
	}
	if (t.n+1)*4 > len(t.slots)*3 {
		t.reserve(2 * (t.n + 1))
		i, _ = t.find(k0, k1)
	}
	t.put(i, idSlot{k0, k1, seq})
	t.n++
}

// del forgets id. The slots after its own that probed past it move back
// (Knuth's algorithm R), so that no probe needs a marker of a deleted key.
func (t *idTable) del(id idKey) {
	k0, k1 := splitKey(id)
	if k0 == 0 && k1 == 0 {
		t.zero = false
		return
	}
	i, ok := t.find(k0, k1)
	if !ok {
		return
	}
	mask := uint64(len(t.slots) - 1)
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := t.slots[j]
		if s.k0 == 0 && s.k1 == 0 {
			break
		}
		// s may fill the hole at i unless its home lies cyclically in (i, j].
		if h := t.home(s.k0); (j-h)&mask >= (j-i)&mask {
			t.put(i, s)
			i = j
		}
	}
	t.put(i, idSlot{})
	t.n--
}

// reserve makes room for n keys (at most three quarters full), keeping
// what t holds.
func (t *idTable) reserve(n int) {
	if n*4 <= len(t.slots)*3 {
		return
	}
	old := t.slots
	t.alloc(n)
	mask := uint64(len(t.slots) - 1)
	for _, s := range old {
		if s.k0 == 0 && s.k1 == 0 {
			continue
		}
		i := t.home(s.k0)
		for t.slots[i].k0 != 0 || t.slots[i].k1 != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s // not published yet
		t.n++
	}
	t.publish()
}

// clear forgets every key, in new slots of the same size.
func (t *idTable) clear() {
	t.slots = make([]idSlot, len(t.slots))
	t.publish()
	t.n, t.zero = 0, false
}

// seqAtLeast reports whether the segment number kept as seq (modulo
// 2^32) is at least ref.
func seqAtLeast(seq uint32, ref uint64) bool { return int32(seq-uint32(ref)) >= 0 }

// seqFull returns the segment number kept as seq (modulo 2^32), read
// against ref, a number of the same partition within 2^31 of it.
func seqFull(seq uint32, ref uint64) uint64 {
	return ref + uint64(int64(int32(seq-uint32(ref))))
}
