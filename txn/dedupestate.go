package txn

import "time"

// idMemory is the idempotency guard's state of one input partition: the
// identities remembered (committed), and those the open transaction
// remembers and forgets, which become committed only when it does.
type idMemory struct {
	at    map[string]int64 // identity → when remembered (Unix ms)
	order []idAt           // oldest first; an entry whose time is not at's is stale
	head  int

	pend      map[string]int64 // remembered in the open transaction
	pendOrder []idAt           // the same, in the order remembered
	forget    map[string]int64 // committed identities the open transaction forgets
}

type idAt struct {
	id string
	ms int64
}

func newIDMemory() *idMemory {
	return &idMemory{at: map[string]int64{}, pend: map[string]int64{}, forget: map[string]int64{}}
}

// load applies a changelog record: ms < 0 forgets id.
func (m *idMemory) load(id string, ms int64) {
	if ms < 0 {
		delete(m.at, id)
		return
	}
	m.at[id] = ms
	m.order = append(m.order, idAt{id, ms})
}

// seen reports whether id is remembered within window.
func (m *idMemory) seen(id string, now time.Time, window time.Duration) bool {
	if _, ok := m.pend[id]; ok {
		return true
	}
	ms, ok := m.at[id]
	if !ok {
		return false
	}
	if _, gone := m.forget[id]; gone {
		return false
	}
	return now.UnixMilli()-ms < window.Milliseconds()
}

// remember remembers id in the open transaction and returns the committed
// identities it forgets with it: past window, or beyond max, oldest first,
// at most two for each one remembered (so that the changelog's tombstones
// keep pace with its new records).
func (m *idMemory) remember(id string, now time.Time, window time.Duration, max int) []string {
	ms := now.UnixMilli()
	m.pend[id] = ms
	m.pendOrder = append(m.pendOrder, idAt{id, ms})
	var out []string
	for i := m.head; i < len(m.order) && len(out) < 2; i++ {
		e := m.order[i]
		cur, ok := m.at[e.id]
		if !ok || cur != e.ms {
			continue // stale: forgotten, or remembered again since
		}
		if _, gone := m.forget[e.id]; gone {
			continue
		}
		if ms-e.ms < window.Milliseconds() && len(m.at)-len(m.forget) < max {
			break
		}
		if _, again := m.pend[e.id]; again {
			continue
		}
		m.forget[e.id] = e.ms
		out = append(out, e.id)
	}
	return out
}

// end makes the open transaction's changes committed, or drops them.
func (m *idMemory) end(committed bool) {
	if committed {
		for id, ms := range m.forget {
			if m.at[id] == ms {
				delete(m.at, id)
			}
		}
		for _, e := range m.pendOrder {
			if m.pend[e.id] == e.ms {
				m.at[e.id] = e.ms
				m.order = append(m.order, e)
			}
		}
		m.trim()
	}
	clear(m.pend)
	clear(m.pendOrder)
	m.pendOrder = m.pendOrder[:0]
	clear(m.forget)
}

// trim drops the stale entries at the front of the order, and compacts it
// once most of it is dropped.
func (m *idMemory) trim() {
	for m.head < len(m.order) {
		e := m.order[m.head]
		if cur, ok := m.at[e.id]; ok && cur == e.ms {
			break
		}
		m.order[m.head] = idAt{}
		m.head++
	}
	if m.head > 1024 && m.head*2 >= len(m.order) {
		n := copy(m.order, m.order[m.head:])
		clear(m.order[n:])
		m.order, m.head = m.order[:n], 0
	}
}

// idsOf returns pv's remembered identities, created on first use. pv.mu
// is held, or pv is not shared yet (a restore).
func (pv *partVersions) idsOf() *idMemory {
	if pv.ids == nil {
		pv.ids = newIDMemory()
	}
	return pv.ids
}

// seenID reports whether id is remembered within window.
func (pv *partVersions) seenID(id string, now time.Time, window time.Duration) bool {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	return pv.idsOf().seen(id, now, window)
}

// rememberID remembers id in the open transaction and returns the
// identities it forgets with it.
func (pv *partVersions) rememberID(id string, now time.Time, window time.Duration, max int) []string {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	return pv.idsOf().remember(id, now, window, max)
}
