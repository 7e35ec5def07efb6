package txn

import (
	"encoding/binary"
	"errors"
	"slices"
	"time"
)

// idMemory is the idempotency guard's state of one input partition: the
// identities remembered, in segments (one changelog record each: the
// identities one transaction remembered, and when), and those the open
// transaction remembers, which become segments only when it commits. An
// identity maps to the sequence number of its segment; the open
// transaction's identities get the numbers its segments will have, so
// that its commit changes no entry.
type idMemory struct {
	at      map[string]uint64  // identity → its segment's sequence number
	segs    map[uint64]segment // committed segments, by sequence number
	order   []uint64           // their sequence numbers, oldest first
	nextSeq uint64             // the open transaction's first segment
	loaded  bool               // at and order are built from segs (a restore loads segs alone)

	pend       []string          // remembered in the open transaction, in order
	prev       map[string]uint64 // the committed segment of a pending identity it replaced
	forgetting map[uint64]bool   // committed segments the open transaction forgets
	writing    []segment         // the segments the open transaction writes
}

// segment is the identities a transaction remembered at ms (Unix ms).
type segment struct {
	seq uint64
	ms  int64
	ids []string
}

// segmentMaxIDs bounds a segment: with identities of at most
// retrytopic.MaxIDLength bytes a segment record stays under 256 KiB, well
// within a producer batch.
const segmentMaxIDs = 1024

func newIDMemory() *idMemory {
	return &idMemory{at: map[string]uint64{}, segs: map[uint64]segment{}, prev: map[string]uint64{}, forgetting: map[uint64]bool{}}
}

// load applies a changelog record of segment seq: ids nil forgets it.
func (m *idMemory) load(seq uint64, ms int64, ids []string) {
	m.loaded = false
	if ids == nil {
		delete(m.segs, seq)
		return
	}
	m.segs[seq] = segment{seq: seq, ms: ms, ids: ids}
}

// build makes at and order from segs, once after a restore.
func (m *idMemory) build() {
	if m.loaded {
		return
	}
	m.loaded = true
	clear(m.at)
	m.order = m.order[:0]
	for seq := range m.segs {
		m.order = append(m.order, seq)
	}
	slices.Sort(m.order)
	for _, seq := range m.order {
		for _, id := range m.segs[seq].ids {
			m.at[id] = seq
		}
		m.nextSeq = seq + 1
	}
}

// seen reports whether id is remembered: by a committed segment that the
// open transaction does not forget, or by the open transaction. A segment
// past the window is forgotten as the next transaction ends, so an
// identity may be remembered up to a transaction longer than the window.
func (m *idMemory) seen(id string) bool {
	m.build()
	seq, ok := m.at[id]
	return ok && !m.forgetting[seq]
}

// remember remembers id in the open transaction.
func (m *idMemory) remember(id string) {
	m.build()
	old, ok := m.at[id]
	if ok && old >= m.nextSeq {
		return // already, in this transaction
	}
	if ok {
		m.prev[id] = old // in a segment this transaction forgets
	}
	m.at[id] = m.nextSeq + uint64(len(m.pend)/segmentMaxIDs)
	m.pend = append(m.pend, id)
}

// write returns what the open transaction writes to the changelog as it
// ends: the segments of the identities it remembered, and the committed
// segments it forgets (past window, or, oldest first, beyond max
// identities).
func (m *idMemory) write(now time.Time, window time.Duration, max int) (segs []segment, forget []uint64) {
	if len(m.pend) == 0 {
		return nil, nil
	}
	ms := now.UnixMilli()
	m.writing = m.writing[:0]
	for i := 0; i < len(m.pend); i += segmentMaxIDs {
		ids := m.pend[i:min(i+segmentMaxIDs, len(m.pend)):min(i+segmentMaxIDs, len(m.pend))]
		m.writing = append(m.writing, segment{seq: m.nextSeq + uint64(i/segmentMaxIDs), ms: ms, ids: ids})
	}
	kept := len(m.at)
	for _, seq := range m.order {
		s := m.segs[seq]
		if ms-s.ms < window.Milliseconds() && kept <= max {
			break
		}
		m.forgetting[seq] = true
		forget = append(forget, seq)
		kept -= len(s.ids)
	}
	return m.writing, forget
}

// end makes the open transaction's changes committed, or drops them.
func (m *idMemory) end(committed bool) {
	if !committed {
		for _, id := range m.pend {
			if old, ok := m.prev[id]; ok {
				m.at[id] = old
			} else {
				delete(m.at, id)
			}
		}
	} else {
		for seq := range m.forgetting {
			for _, id := range m.segs[seq].ids {
				if m.at[id] == seq {
					delete(m.at, id)
				}
			}
			delete(m.segs, seq)
		}
		if len(m.forgetting) > 0 {
			m.order = slices.DeleteFunc(m.order, func(seq uint64) bool { return m.forgetting[seq] })
		}
		for _, s := range m.writing {
			m.segs[s.seq] = s
			m.order = append(m.order, s.seq)
		}
		if len(m.pend) > 0 {
			m.nextSeq += uint64((len(m.pend) + segmentMaxIDs - 1) / segmentMaxIDs)
		}
	}
	m.pend, m.writing = nil, nil
	clear(m.prev)
	clear(m.forgetting)
}

// segmentKey is the changelog key of segment seq.
func segmentKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{kindDedupe}, seq)
}

// segmentValue encodes s: its time, then each identity, length first.
func segmentValue(s segment) []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(s.ms))
	for _, id := range s.ids {
		b = binary.AppendUvarint(b, uint64(len(id)))
		b = append(b, id...)
	}
	return b
}

// parseSegment decodes a segment's changelog record (value nil: a
// tombstone, ids nil).
func parseSegment(key, value []byte) (seq uint64, ms int64, ids []string, err error) {
	if len(key) != 9 {
		return 0, 0, nil, errors.New("dedupe segment key: not 9 bytes")
	}
	seq = binary.BigEndian.Uint64(key[1:])
	if value == nil {
		return seq, 0, nil, nil
	}
	if len(value) < 8 {
		return 0, 0, nil, errors.New("dedupe segment: shorter than its time")
	}
	ms = int64(binary.BigEndian.Uint64(value))
	ids = []string{}
	for b := value[8:]; len(b) > 0; {
		n, w := binary.Uvarint(b)
		if w <= 0 || uint64(len(b)-w) < n {
			return 0, 0, nil, errors.New("dedupe segment: a truncated identity")
		}
		ids = append(ids, string(b[w:w+int(n)]))
		b = b[w+int(n):]
	}
	return seq, ms, ids, nil
}

// idsOf returns pv's remembered identities, created on first use. pv.mu
// is held, or pv is not shared yet (a restore).
func (pv *partVersions) idsOf() *idMemory {
	if pv.ids == nil {
		pv.ids = newIDMemory()
	}
	return pv.ids
}

// seenID reports whether id is remembered.
func (pv *partVersions) seenID(id string) bool {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	return pv.idsOf().seen(id)
}

// rememberID remembers id in the open transaction.
func (pv *partVersions) rememberID(id string) {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	pv.idsOf().remember(id)
}

// writeIDs returns the changelog writes of the open transaction's
// remembered identities (idMemory.write).
func (pv *partVersions) writeIDs(now time.Time, window time.Duration, max int) ([]segment, []uint64) {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if pv.ids == nil {
		return nil, nil
	}
	return pv.ids.write(now, window, max)
}
