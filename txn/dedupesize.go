package txn

import "time"

// sizeHorizon is how far ahead the guard sizes a partition's tables at the
// rate it remembers identities: a partition that remembers fast gets tables
// for what it will hold a minute on (at most MaxIDs, and no more than its
// window holds) at once, instead of growing them step by step, each step
// moving every identity it holds. A quiet partition's tables grow as they
// fill.
const sizeHorizon = time.Minute

// minSized is the fewest identities the guard sizes a partition's tables
// for ahead of time: below it, growing costs little.
const minSized = 16 * 1024

// mapSizing is what the guard knows of a partition's rate: since when it
// has counted, and the size its tables were last made for.
type mapSizing struct {
	since int64 // Unix ms of the first transaction that remembered, after a start or restore
	base  int   // the identities kept then (a restore's among them): the rate counts those added since
	sized int   // identities the tables were made for, 0 when they grew alone
}

// sizeFor makes the stripes' tables large enough for what the partition
// will hold over sizeHorizon at the rate it has remembered so far: kept
// identities (the committed ones and the open transaction's) added since
// the first transaction that remembered, not those restored before it.
// m.mu is held.
func (m *idMemory) sizeFor(now time.Time, window time.Duration, max, kept int) {
	ms := now.UnixMilli()
	if m.sizing.since == 0 {
		m.sizing.since, m.sizing.base = ms, kept
		return
	}
	elapsed := ms - m.sizing.since
	if elapsed <= 0 {
		return
	}
	want := int(min(int64(max), int64(kept-m.sizing.base)*min(window, sizeHorizon).Milliseconds()/elapsed))
	if want < minSized || want < 2*m.sizing.sized {
		return
	}
	m.resize(want)
}

// resize makes room in each stripe's table for its share of n
// identities (and an eighth more, as identities do not spread evenly),
// keeping what it holds. m.mu is held.
func (m *idMemory) resize(n int) {
	per := n/idStripes + n/idStripes/8
	for i := range m.stripes {
		st := &m.stripes[i]
		st.mu.Lock()
		st.at.reserve(max(per, st.at.len()))
		st.mu.Unlock()
	}
	m.sizing.sized = n
}
