package txn

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// idKey is what the guard keeps of an identity: the first 128 bits of its
// SHA-256. A fixed-size key makes each lookup one probe of a flat table
// (idTable, which compares the first 96 of them) and each changelog entry
// 16 bytes, and two identities share a key only by a SHA-256 collision
// (far less likely than any hardware fault).
type idKey [16]byte

func keyOfID(id []byte) idKey {
	sum := sha256.Sum256(id)
	return idKey(sum[:16])
}

// idMemory is the idempotency guard's state of one input partition: the
// identities remembered, in segments (one changelog record each: the
// identities one transaction remembered, and when), and those the open
// transaction remembers, which become segments only when it commits. An
// identity maps to the sequence number of its segment; the open
// transaction's identities get the numbers its segments will have, so
// that its commit changes no entry. The identities are kept in stripes,
// each with its lock, so that the key-shards of a partition look up and
// remember without waiting for one another.
type idMemory struct {
	mu      sync.Mutex         // the segments, a restore, write and end; taken before a stripe's
	segs    map[uint64]segment // committed segments, by sequence number
	order   []uint64           // their sequence numbers, oldest first
	loaded  atomic.Bool        // the stripes are built from segs (a restore loads segs alone)
	writing []segment          // the segments the open transaction writes
	forgot  uint64             // committed segments below it are forgotten
	sizing  mapSizing          // how large the stripes' tables were made

	openSeq     atomic.Uint64 // the open transaction's first segment
	forgetBelow atomic.Uint64 // segments below it are forgotten, or being forgotten by the open transaction
	expireBelow atomic.Uint64 // segments below it are past the window (expire), not yet forgotten
	stripes     [idStripes]idStripe
}

// idStripes is the number of stripes; each stripe takes up to
// stripeSegIDs identities of a segment, so that a segment holds at most
// segmentMaxIDs and a remember touches no state other stripes write.
const (
	idStripes    = 16
	stripeSegIDs = segmentMaxIDs / idStripes
)

type idStripe struct {
	mu   sync.Mutex
	at   *idTable         // identity → its segment's sequence number (modulo 2^32)
	pend []idKey          // remembered in the open transaction
	prev map[idKey]uint64 // the segment of a pending identity it replaced
	// The stripes sit side by side and the key-shards of a partition
	// lock different ones at once: each stripe has cache lines of its
	// own (64-byte lines; 128 covers the pair a CPU may fetch together).
	_ [128 - 8 - 8 - 24 - 8]byte
}

// segment is the identities a transaction remembered at ms (Unix ms).
type segment struct {
	seq uint64
	ms  int64
	ids []idKey
}

// segmentMaxIDs bounds a segment: its record stays under 64 KiB, well
// within a producer batch.
const segmentMaxIDs = 4000

func newIDMemory() *idMemory {
	m := &idMemory{segs: map[uint64]segment{}}
	for i := range m.stripes {
		m.stripes[i].at = newIDTable(0)
		m.stripes[i].prev = map[idKey]uint64{}
	}
	return m
}

func (m *idMemory) stripe(id idKey) *idStripe { return &m.stripes[id[0]%idStripes] }

// load applies a changelog record of segment seq: ids nil forgets it.
func (m *idMemory) load(seq uint64, ms int64, ids []idKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loaded.Store(false)
	if ids == nil {
		delete(m.segs, seq)
		return
	}
	m.segs[seq] = segment{seq: seq, ms: ms, ids: ids}
}

// build makes the stripes and order from segs, once after a restore.
func (m *idMemory) build() {
	if m.loaded.Load() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.loaded.Load() {
		return
	}
	m.order = m.order[:0]
	for seq := range m.segs {
		m.order = append(m.order, seq)
	}
	slices.Sort(m.order)
	n := 0
	for _, s := range m.segs {
		n += len(s.ids)
	}
	for i := range m.stripes {
		m.stripes[i].at.clear()
	}
	m.sizing = mapSizing{}
	m.resize(n) // the restored identities, in tables made for them at once
	next := uint64(0)
	for _, seq := range m.order {
		for _, id := range m.segs[seq].ids {
			m.stripe(id).at.set(id, uint32(seq))
		}
		next = seq + 1
	}
	m.forgot = next
	if len(m.order) > 0 {
		m.forgot = m.order[0]
	}
	m.forgetBelow.Store(m.forgot)
	m.openSeq.Store(next)
	m.loaded.Store(true)
}

// touch reads, with no lock, the line of each stripe's table where the
// lookup of each of ids starts: a partition's identities do not stay in
// the CPU's caches, and a batch's reads issued together overlap their
// misses, where the lookups, made one per record between handler calls,
// would each wait for its own.
func (m *idMemory) touch(ids []idKey) {
	m.build()
	for i := range ids {
		m.stripe(ids[i]).at.touch(ids[i])
	}
}

// seen reports whether id is remembered within window: by a committed
// segment that is not past it (as expire last found) and that the open
// transaction does not forget, or by the open transaction (within any
// window of a millisecond or more).
func (m *idMemory) seen(id idKey, window time.Duration) bool {
	m.build()
	st := m.stripe(id)
	st.mu.Lock()
	seq, ok := st.at.get(id)
	st.mu.Unlock()
	if !ok {
		return false
	}
	if seqAtLeast(seq, m.openSeq.Load()) {
		return window >= time.Millisecond
	}
	return seqAtLeast(seq, max(m.forgetBelow.Load(), m.expireBelow.Load()))
}

// expire notes which committed segments are past the window at now, for
// seen: the scope calls it before each poll and after each transaction,
// so a lookup needs no clock of its own. Their identities are forgotten by the next transaction that
// remembers any (write).
func (m *idMemory) expire(now time.Time, window time.Duration) {
	m.build()
	m.mu.Lock()
	defer m.mu.Unlock()
	oldest := now.UnixMilli() - window.Milliseconds()
	below := uint64(0)
	for _, seq := range m.order {
		if m.segs[seq].ms > oldest {
			break
		}
		below = seq + 1
	}
	if below > m.expireBelow.Load() {
		m.expireBelow.Store(below)
	}
}

// remember remembers id in the open transaction.
func (m *idMemory) remember(id idKey) {
	m.build()
	open := m.openSeq.Load()
	st := m.stripe(id)
	st.mu.Lock()
	defer st.mu.Unlock()
	old, ok := st.at.get(id)
	if ok && seqAtLeast(old, open) {
		return // already, in this transaction
	}
	if ok {
		st.prev[id] = seqFull(old, open) // in a segment this transaction forgets
	}
	st.at.set(id, uint32(open+uint64(len(st.pend)/stripeSegIDs)))
	st.pend = append(st.pend, id)
}

// write returns what the open transaction writes to the changelog as it
// ends: the segments of the identities it remembered, and the committed
// segments it forgets (past window, or, oldest first, beyond max
// identities). No identity is remembered meanwhile (the transaction's
// gate is shut).
func (m *idMemory) write(now time.Time, window time.Duration, max int) (segs []segment, forget []uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	open, kept := m.openSeq.Load(), 0
	m.writing = m.writing[:0]
	for i := range m.stripes {
		st := &m.stripes[i]
		st.mu.Lock()
		kept += st.at.len()
		for k, id := range st.pend {
			c := k / stripeSegIDs // remember gave the k-th identity of the stripe segment open+c
			for len(m.writing) <= c {
				m.writing = append(m.writing, segment{seq: open + uint64(len(m.writing)), ms: now.UnixMilli()})
			}
			m.writing[c].ids = append(m.writing[c].ids, id)
		}
		st.mu.Unlock()
	}
	if len(m.writing) == 0 {
		return nil, nil
	}
	m.sizeFor(now, window, max, kept)
	ms := now.UnixMilli()
	below := m.forgot
	for _, seq := range m.order {
		s := m.segs[seq]
		if ms-s.ms < window.Milliseconds() && kept <= max {
			break
		}
		forget = append(forget, seq)
		kept -= len(s.ids)
		below = seq + 1
	}
	m.forgetBelow.Store(below)
	m.writing = slices.DeleteFunc(m.writing, func(s segment) bool { return len(s.ids) == 0 })
	return m.writing, forget
}

// end makes the open transaction's changes committed, or drops them.
func (m *idMemory) end(committed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	below := m.forgetBelow.Load()
	segs := 0 // the segments the open transaction's identities fill
	for i := range m.stripes {
		st := &m.stripes[i]
		st.mu.Lock()
		segs = max(segs, (len(st.pend)+stripeSegIDs-1)/stripeSegIDs)
		if !committed {
			for _, id := range st.pend {
				if old, ok := st.prev[id]; ok {
					st.at.set(id, uint32(old))
				} else {
					st.at.del(id)
				}
			}
		}
		st.pend = st.pend[:0]
		clear(st.prev)
		st.mu.Unlock()
	}
	if !committed {
		m.forgetBelow.Store(m.forgot)
	} else {
		n := 0
		for n < len(m.order) && m.order[n] < below {
			for _, id := range m.segs[m.order[n]].ids {
				st := m.stripe(id)
				st.mu.Lock()
				if seq, ok := st.at.get(id); ok && !seqAtLeast(seq, below) {
					st.at.del(id)
				}
				st.mu.Unlock()
			}
			delete(m.segs, m.order[n])
			n++
		}
		m.order = slices.Delete(m.order, 0, n)
		m.forgot = below
		for _, s := range m.writing {
			m.segs[s.seq] = s
			m.order = append(m.order, s.seq)
		}
		m.openSeq.Add(uint64(segs))
	}
	m.writing = nil
}

// segmentKey is the changelog key of segment seq.
func segmentKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{kindDedupe}, seq)
}

// segmentValue encodes s: its time, then each identity's key.
func segmentValue(s segment) []byte {
	b := make([]byte, 8, 8+len(s.ids)*len(idKey{}))
	binary.BigEndian.PutUint64(b, uint64(s.ms))
	for _, id := range s.ids {
		b = append(b, id[:]...)
	}
	return b
}

// parseSegment decodes a segment's changelog record (value nil: a
// tombstone, ids nil).
func parseSegment(key, value []byte) (seq uint64, ms int64, ids []idKey, err error) {
	if len(key) != 9 {
		return 0, 0, nil, errors.New("dedupe segment key: not 9 bytes")
	}
	seq = binary.BigEndian.Uint64(key[1:])
	if value == nil {
		return seq, 0, nil, nil
	}
	if len(value) < 8 || (len(value)-8)%len(idKey{}) != 0 {
		return 0, 0, nil, errors.New("dedupe segment: not a time and whole identity keys")
	}
	ms = int64(binary.BigEndian.Uint64(value))
	ids = make([]idKey, 0, (len(value)-8)/len(idKey{}))
	for b := value[8:]; len(b) > 0; b = b[len(idKey{}):] {
		ids = append(ids, idKey(b[:len(idKey{})]))
	}
	return seq, ms, ids, nil
}

// idsOf returns pv's remembered identities, created on first use.
func (pv *partVersions) idsOf() *idMemory {
	if m := pv.ids.Load(); m != nil {
		return m
	}
	pv.ids.CompareAndSwap(nil, newIDMemory())
	return pv.ids.Load()
}

// seenID reports whether id is remembered within window.
func (pv *partVersions) seenID(id idKey, window time.Duration) bool {
	return pv.idsOf().seen(id, window)
}

// touchIDs readies the lookups of ids (idMemory.touch).
func (pv *partVersions) touchIDs(ids []idKey) { pv.idsOf().touch(ids) }

// rememberID remembers id in the open transaction.
func (pv *partVersions) rememberID(id idKey) { pv.idsOf().remember(id) }

// expireIDs notes which of pv's remembered identities are past window.
func (pv *partVersions) expireIDs(now time.Time, window time.Duration) {
	if m := pv.ids.Load(); m != nil {
		m.expire(now, window)
	}
}

// writeIDs returns the changelog writes of the open transaction's
// remembered identities (idMemory.write).
func (pv *partVersions) writeIDs(now time.Time, window time.Duration, max int) ([]segment, []uint64) {
	return pv.idsOf().write(now, window, max)
}
