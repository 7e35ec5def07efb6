package txn

import (
	"fmt"
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

// A transaction that remembers more identities than a segment holds writes
// several segments, none over segmentMaxIDs and none empty, each identity
// in exactly one; once committed, every one is seen, and the next
// transaction's segments follow them.
func TestIDMemorySegmentsAreBounded(t *testing.T) {
	m := newIDMemory()
	now := time.UnixMilli(1_000_000)
	const n = 3*segmentMaxIDs + 17
	for i := range n {
		m.remember(keyOfID([]byte(fmt.Sprint("id-", i))))
	}
	segs, forget := m.write(now, time.Hour, 1_000_000)
	if len(forget) != 0 {
		t.Fatalf("forgets %v; want nothing", forget)
	}
	in := map[idKey]int{}
	for i, s := range segs {
		if len(s.ids) == 0 || len(s.ids) > segmentMaxIDs {
			t.Errorf("segment %d holds %d identities; want 1 to %d", i, len(s.ids), segmentMaxIDs)
		}
		if s.seq != uint64(i) {
			t.Errorf("segment %d has sequence number %d", i, s.seq)
		}
		for _, id := range s.ids {
			in[id]++
		}
	}
	if len(in) != n {
		t.Fatalf("%d identities in the segments; want %d", len(in), n)
	}
	for id, c := range in {
		if c != 1 {
			t.Fatalf("identity %x in %d segments", id, c)
		}
	}
	m.end(true)
	for i := range n {
		if !m.seen(keyOfID([]byte(fmt.Sprint("id-", i))), time.Hour) {
			t.Fatalf("id-%d not seen after the commit", i)
		}
	}
	m.remember(keyOfID([]byte("next")))
	next, _ := m.write(now, time.Hour, 1_000_000)
	if len(next) != 1 || next[0].seq != uint64(len(segs)) {
		t.Fatalf("the next transaction writes %+v; want one segment numbered %d", next, len(segs))
	}
}

// A partition that remembers fast gets tables sized for what it will hold
// over sizeHorizon (at most max) once its rate is known, and keeps every
// identity through the resize; a quiet partition's tables grow alone.
func TestIDMemorySizesItsTablesAtItsRate(t *testing.T) {
	k := func(i int) idKey { return keyOfID(fmt.Appendf(nil, "in/0/%d", i)) }
	t0 := time.UnixMilli(1_000_000)
	const max = 100_000
	fill := func(m *idMemory, from, to int, at time.Time) {
		for i := from; i < to; i++ {
			m.remember(k(i))
		}
		m.write(at, time.Hour, max)
		m.end(true)
	}

	busy := newIDMemory()
	fill(busy, 0, 5_000, t0)
	if busy.sizing.sized != 0 {
		t.Fatalf("tables sized for %d identities after one transaction; want none before the rate is known", busy.sizing.sized)
	}
	fill(busy, 5_000, 10_000, t0.Add(100*time.Millisecond)) // 10,000 in 100 ms: a minute's worth is beyond max
	if busy.sizing.sized != max {
		t.Fatalf("tables sized for %d identities at 100 a millisecond; want max, %d", busy.sizing.sized, max)
	}
	for i := range busy.stripes {
		if st := &busy.stripes[i]; len(st.at.slots)*3 < (max/idStripes)*4 {
			t.Fatalf("stripe %d has %d slots: it would grow before it holds its share of %d identities", i, len(st.at.slots), max)
		}
	}
	for i := range 10_000 {
		if !busy.seen(k(i), time.Hour) {
			t.Fatalf("identity %d not seen after the tables were resized", i)
		}
	}

	quiet := newIDMemory()
	fill(quiet, 0, 10, t0)
	fill(quiet, 10, 20, t0.Add(time.Second)) // 20 a second: 1,200 a minute
	if quiet.sizing.sized != 0 {
		t.Fatalf("a quiet partition's tables sized for %d identities; want them to grow alone", quiet.sizing.sized)
	}

	// A quiet partition restored with many identities is not taken for a
	// busy one: its rate counts the identities added since.
	rq := newIDMemory()
	many := make([]idKey, 20_000)
	for i := range many {
		many[i] = k(100_000 + i)
	}
	rq.load(0, t0.UnixMilli(), many)
	fill(rq, 0, 10, t0)
	fill(rq, 10, 20, t0.Add(time.Second))
	if rq.sizing.sized != len(many) {
		t.Fatalf("a quiet restored partition's tables sized for %d identities; want the %d it restored", rq.sizing.sized, len(many))
	}

	// A restore makes the tables for the identities it loads, and counts the
	// rate anew.
	r := newIDMemory()
	r.load(0, t0.UnixMilli(), []idKey{k(1), k(2), k(3)})
	if !r.seen(k(2), time.Hour) || r.sizing.sized != 3 || r.sizing.since != 0 {
		t.Fatalf("after a restore of 3 identities: seen %v, sized for %d, counting since %d; want seen, 3, 0",
			r.seen(k(2), time.Hour), r.sizing.sized, r.sizing.since)
	}
}

// Segment numbers are kept modulo 2^32 in the guard's tables: a partition
// whose numbers cross 2^32 (restored from a changelog that reached it)
// sees, remembers, forgets and rolls back as anywhere else.
func TestIDMemoryAcrossTheWrapOfSegmentNumbers(t *testing.T) {
	k := func(id string) idKey { return keyOfID([]byte(id)) }
	t0 := time.UnixMilli(1_000_000)
	const window = time.Hour
	const base = 1<<32 - 2
	m := newIDMemory()
	for i, id := range []string{"a", "b", "c"} {
		m.load(base+uint64(i), t0.UnixMilli(), []idKey{k(id)}) // 2^32-2, 2^32-1, 2^32
	}
	for _, id := range []string{"a", "b", "c"} {
		if !m.seen(k(id), window) {
			t.Fatalf("restored %s not seen", id)
		}
	}
	m.remember(k("d")) // segment 2^32+1
	if !m.seen(k("d"), window) {
		t.Fatal("d not seen in its own transaction")
	}
	segs, forget := m.write(t0, window, 3)
	if len(segs) != 1 || segs[0].seq != base+3 || !slices.Equal(forget, []uint64{base}) {
		t.Fatalf("writes %+v and forgets %v; want segment %d and the oldest, %d", segs, forget, uint64(base+3), uint64(base))
	}
	if m.seen(k("a"), window) {
		t.Fatal("a seen while the open transaction forgets it")
	}
	m.end(false)
	if !m.seen(k("a"), window) || m.seen(k("d"), window) {
		t.Fatal("after the abort: want a remembered and d not")
	}
	m.remember(k("d"))
	m.write(t0, window, 3)
	m.end(true)
	if m.seen(k("a"), window) || !m.seen(k("b"), window) || !m.seen(k("c"), window) || !m.seen(k("d"), window) {
		t.Fatal("after the commit: want a forgotten, b, c and d remembered")
	}
	m.remember(k("e"))
	if segs, _ := m.write(t0, window, 3); segs[0].seq != base+4 {
		t.Fatalf("the next segment is %d; want %d", segs[0].seq, uint64(base+4))
	}
}
