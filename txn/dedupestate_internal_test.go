package txn

import (
	"slices"
	"testing"
	"time"
)

// The remembered identities of a partition: a transaction's identities
// count once it commits and are dropped when it aborts; each committed
// transaction's identities are a segment, written as one changelog
// record; segments past the window, or beyond the maximum, are forgotten
// oldest first, and only once the transaction that forgets them commits.
func TestIDMemory(t *testing.T) {
	k := func(id string) idKey { return keyOfID([]byte(id)) }
	m := newIDMemory()
	t0 := time.UnixMilli(1_000_000)
	const window = time.Minute
	m.remember(k("a"))
	if !m.seen(k("a"), window) {
		t.Fatal("a not seen in its own transaction")
	}
	m.end(false)
	if m.seen(k("a"), window) {
		t.Fatal("a seen after its transaction aborted")
	}
	for i, id := range []string{"a", "b", "c"} {
		m.remember(k(id))
		segs, forget := m.write(t0.Add(time.Duration(i)*time.Second), window, 3)
		if len(segs) != 1 || !slices.Equal(segs[0].ids, []idKey{k(id)}) || len(forget) != 0 {
			t.Fatalf("transaction %d writes %v and forgets %v; want one segment of %s, nothing forgotten", i, segs, forget, id)
		}
		m.end(true)
	}
	m.remember(k("d"))
	segs, forget := m.write(t0.Add(3*time.Second), window, 3)
	if len(segs) != 1 || !slices.Equal(forget, []uint64{0}) {
		t.Fatalf("a fourth identity beyond a maximum of 3 forgets %v; want the oldest segment, 0 (a)", forget)
	}
	if m.seen(k("a"), window) {
		t.Fatal("a seen while the open transaction forgets it")
	}
	m.end(false)
	if !m.seen(k("a"), window) {
		t.Fatal("a forgotten though the transaction that forgot it aborted")
	}
	later := t0.Add(window + 1500*time.Millisecond)
	m.remember(k("e")) // b is past its window: the transaction that ends next forgets it
	_, forget = m.write(later, window, 3)
	if !slices.Equal(forget, []uint64{0, 1}) {
		t.Fatalf("remembering past the window forgets %v; want segments 0 and 1 (a, b)", forget)
	}
	m.end(true)
	if m.seen(k("a"), window) || m.seen(k("b"), window) || !m.seen(k("c"), window) || !m.seen(k("e"), window) {
		t.Fatal("after the commit: want a and b forgotten, c and e remembered")
	}

	// A segment's changelog record restores it; a tombstone forgets it.
	r := newIDMemory()
	for _, s := range []segment{{seq: 2, ms: t0.UnixMilli(), ids: []idKey{k("c")}}, {seq: 5, ms: later.UnixMilli(), ids: []idKey{k("e"), k("f")}}} {
		seq, ms, ids, err := parseSegment(segmentKey(s.seq), segmentValue(s))
		if err != nil {
			t.Fatal(err)
		}
		r.load(seq, ms, ids)
	}
	seq, _, ids, err := parseSegment(segmentKey(2), nil)
	if err != nil || ids != nil {
		t.Fatalf("tombstone parsed as %v, %v", ids, err)
	}
	r.load(seq, 0, nil)
	if r.seen(k("c"), window) || !r.seen(k("f"), window) {
		t.Fatal("restored: want c forgotten by its tombstone, f remembered")
	}
	r.remember(k("g"))
	if segs, _ := r.write(later, window, 100); segs[0].seq != 6 {
		t.Fatalf("the next segment after a restore is %d; want 6", segs[0].seq)
	}
}
