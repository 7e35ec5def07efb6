package txn

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// tableKey makes a key from its two compared parts and a tail the table
// does not keep; few k0 values make keys share their home slot.
func tableKey(k0 uint64, k1 uint32, tail uint32) idKey {
	var id idKey
	binary.LittleEndian.PutUint64(id[:8], k0)
	binary.LittleEndian.PutUint32(id[8:12], k1)
	binary.LittleEndian.PutUint32(id[12:], tail)
	return id
}

// checkTable compares t with the model, key by key, and checks that every
// key t holds is reachable from its home without crossing an empty slot.
func checkTable(t *testing.T, tab *idTable, model map[idKey]uint32, universe []idKey) {
	t.Helper()
	if tab.len() != len(model) {
		t.Fatalf("len %d, the model holds %d", tab.len(), len(model))
	}
	for _, id := range universe {
		want, wok := model[id]
		got, ok := tab.get(id)
		if ok != wok || (ok && got != want) {
			t.Fatalf("get(%x) = %d, %v; the model has %d, %v", id[:12], got, ok, want, wok)
		}
	}
	mask := uint64(len(tab.slots) - 1)
	for i, s := range tab.slots {
		if s.k0 == 0 && s.k1 == 0 {
			continue
		}
		for j := tab.home(s.k0); j != uint64(i); j = (j + 1) & mask {
			if e := tab.slots[j]; e.k0 == 0 && e.k1 == 0 {
				t.Fatalf("slot %d is cut off from its home %d by the empty slot %d", i, tab.home(s.k0), j)
			}
		}
	}
}

// FuzzIDTable runs random sets, deletes, reserves and clears on the table
// and on a map, over keys that share home slots (a few k0 values), differ
// only in the bytes the table keeps or only in those it does not, and the
// all-zero key, and compares them after every operation.
func FuzzIDTable(f *testing.F) {
	f.Add(uint64(1), uint16(400))
	f.Add(uint64(7), uint16(3000))
	f.Fuzz(func(t *testing.T, seed uint64, steps uint16) {
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		var universe []idKey
		for k0 := range uint64(6) {
			for k1 := range uint32(12) {
				universe = append(universe, tableKey(k0*0x1000_0000_0000_0001, k1, 0))
			}
		}
		for range 40 {
			universe = append(universe, tableKey(rng.Uint64(), rng.Uint32(), 0))
		}
		tab := newIDTable(0)
		model := map[idKey]uint32{}
		for range steps {
			id := universe[rng.IntN(len(universe))]
			switch op := rng.IntN(20); {
			case op < 11:
				seq := rng.Uint32()
				tab.set(id, seq)
				model[id] = seq
			case op < 18:
				tab.del(id)
				delete(model, id)
			case op < 19:
				tab.reserve(rng.IntN(200))
			default:
				if rng.IntN(10) == 0 {
					tab.clear()
					clear(model)
				}
			}
			checkTable(t, tab, model, universe)
		}
	})
}

// The table keeps 12 of a key's 16 bytes: keys that differ only in the
// last four are one key to it, and the guard's idKey is the start of a
// SHA-256, so two identities meet that way by chance once in 2^96.
func TestIDTableKeepsTwelveBytes(t *testing.T) {
	tab := newIDTable(0)
	tab.set(tableKey(5, 6, 1), 10)
	if seq, ok := tab.get(tableKey(5, 6, 2)); !ok || seq != 10 {
		t.Fatalf("a key differing in the last four bytes: %d, %v", seq, ok)
	}
	if _, ok := tab.get(tableKey(5, 7, 1)); ok {
		t.Fatal("a key differing in bytes 8 to 11 was found")
	}
}

// Many keys grow the table, which keeps each one, at most three quarters
// full.
func TestIDTableGrows(t *testing.T) {
	tab := newIDTable(0)
	model := map[idKey]uint32{}
	var universe []idKey
	for i := range 50_000 {
		id := keyOfID(binary.BigEndian.AppendUint32(nil, uint32(i)))
		tab.set(id, uint32(i))
		model[id] = uint32(i)
		universe = append(universe, id)
	}
	if tab.n*4 > len(tab.slots)*3 {
		t.Fatalf("%d keys in %d slots", tab.n, len(tab.slots))
	}
	checkTable(t, tab, model, universe)
	for i, id := range universe {
		if i%3 != 0 {
			tab.del(id)
			delete(model, id)
		}
	}
	checkTable(t, tab, model, universe)
}

// Segment numbers kept modulo 2^32 compare and read back across the wrap.
func TestSeqModulo(t *testing.T) {
	for _, ref := range []uint64{0, 5, math.MaxUint32 - 2, math.MaxUint32, math.MaxUint32 + 3, 1 << 40} {
		for _, d := range []int64{-1 << 30, -3, -1, 0, 1, 2, 1 << 30} {
			if int64(ref)+d < 0 {
				continue
			}
			seq := uint64(int64(ref) + d)
			if got := seqAtLeast(uint32(seq), ref); got != (d >= 0) {
				t.Errorf("seqAtLeast(%d, %d) = %v", seq, ref, got)
			}
			if got := seqFull(uint32(seq), ref); got != seq {
				t.Errorf("seqFull(%d mod 2^32, %d) = %d", seq, ref, got)
			}
		}
	}
}
