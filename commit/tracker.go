package commit

import (
	"math/bits"
	"slices"
	"sort"
	"sync"
)

// Offset is a committable position: the next offset to consume and the leader
// epoch of the last finished record (-1 when unknown). It mirrors
// kgo.EpochOffset so that this package does not depend on the client.
type Offset struct {
	Epoch  int32
	Offset int64
}

// entry is one outstanding offset, or a run of finished ones (run): a run
// covers offset..ts (the offsets of every record finished between them,
// and any gap), with the epoch of the last. Any other entry's ts is its
// record's timestamp, Unix milliseconds (0 if not given). Whether an entry
// is finished is kept apart from it, in Partition.done.
type entry struct {
	offset int64
	ts     int64
	epoch  int32
	run    bool
}

// last returns the last offset e covers.
func (e *entry) last() int64 {
	if e.run {
		return e.ts
	}
	return e.offset
}

// Partition is the watermark of one assignment of one topic partition. Its
// methods are safe for concurrent use: the poll loop adds offsets while the
// workers finish them.
type Partition struct {
	Topic     string
	Partition int32

	mu      sync.Mutex
	entries []entry // outstanding offsets in increasing order, from head on
	// done holds a bit for each entry, set once it finished (bits past
	// the last entry are zero). The poll loop writes entries and the
	// workers on other cores finish them: a bit makes a worker's mark one
	// word for 64 records instead of a write to the cache line of entries
	// the poll loop has just written.
	done []uint64
	// dense says entries[i].offset is entries[0].offset+i for every i:
	// a poll's offsets are consecutive but for gaps (aborted or compacted
	// records) and merged runs, so a worker finds its record's entry
	// without reading it.
	dense    bool
	head     int
	lastAdd  int64
	commit   Offset // next offset to commit; Offset < 0 means nothing finished yet
	pending  int    // entries neither finished nor abandoned
	detached bool
}

// NewPartition returns the tracker of a fresh assignment of topic/partition.
func NewPartition(topic string, partition int32) *Partition {
	return &Partition{Topic: topic, Partition: partition, lastAdd: -1, commit: Offset{Epoch: -1, Offset: -1}, dense: true}
}

// Add records that offset was dispatched. Offsets must be added in
// increasing order (the order a partition is consumed in); an offset at or
// below the last added one is ignored and Add reports false.
func (p *Partition) Add(offset int64, epoch int32) bool {
	return p.AddTimed(offset, epoch, 0)
}

// AddTimed is Add for a record with timestamp ts (Unix milliseconds), which
// [Partition.Position] reports while the record is the oldest unfinished.
func (p *Partition) AddTimed(offset int64, epoch int32, ts int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.detached || offset <= p.lastAdd {
		return false
	}
	p.lastAdd = offset
	p.compactLocked()
	p.appendLocked(entry{offset: offset, epoch: epoch, ts: ts})
	p.pending++
	return true
}

// AddAll adds n offsets under one lock, as n calls of AddTimed would:
// at(i) returns the i-th offset, its leader epoch and its timestamp (0 when
// not kept), in increasing offset order. Offsets at or below the last added
// one are ignored; being increasing, they are a prefix. AddAll returns the
// index of the first offset it added: n when it added none (every offset
// was old, or the assignment ended).
func (p *Partition) AddAll(n int, at func(i int) (offset int64, epoch int32, ts int64)) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.detached {
		return n
	}
	p.compactLocked()
	first := n
	for i := range n {
		off, epoch, ts := at(i)
		if off <= p.lastAdd {
			continue
		}
		if first == n {
			first = i
			p.entries = slices.Grow(p.entries, n-i)
			p.done = slices.Grow(p.done, max(0, (len(p.entries)+n-i+63)/64-len(p.done)))
		}
		p.lastAdd = off
		p.appendLocked(entry{offset: off, epoch: epoch, ts: ts})
		p.pending++
	}
	return first
}

// compactLocked drops the finished entries before head once they are most
// of the slice, so that it does not grow with the partition's life, and
// merges the finished entries behind an unfinished one into runs once they
// are most of what is outstanding, so that a record stuck at the head
// costs memory for the unfinished records only, not for every record
// finished behind it.
func (p *Partition) compactLocked() {
	if p.head > 0 && p.head == len(p.entries) {
		clear(p.done[:(len(p.entries)+63)/64])
		p.entries = p.entries[:0]
		p.head = 0
		p.dense = true
	} else if p.head > 1024 && p.head*2 > len(p.entries) {
		n := copy(p.entries, p.entries[p.head:])
		p.shiftDoneLocked(p.head, len(p.entries))
		p.entries = p.entries[:n]
		p.head = 0
	}
	if live := len(p.entries) - p.head; live > 1024 && live > 4*p.pending {
		p.mergeRunsLocked()
	}
}

// appendLocked appends e, unfinished, to entries.
func (p *Partition) appendLocked(e entry) {
	if n := len(p.entries); n > 0 && p.dense && e.offset != p.entries[0].offset+int64(n) {
		p.dense = false
	}
	p.entries = append(p.entries, e)
	if w := (len(p.entries) + 63) / 64; w > len(p.done) {
		p.done = append(p.done, 0)
	}
}

// isDone reports whether entries[i] finished.
func (p *Partition) isDone(i int) bool { return p.done[i>>6]&(1<<(i&63)) != 0 }

// setDone sets whether entries[i] finished.
func (p *Partition) setDone(i int, done bool) {
	if done {
		p.done[i>>6] |= 1 << (i & 63)
	} else {
		p.done[i>>6] &^= 1 << (i & 63)
	}
}

// shiftDoneLocked moves the bits of entries[from:n] to the front, as the
// compaction moves the entries, and clears the rest.
func (p *Partition) shiftDoneLocked(from, n int) {
	for i := from; i < n; i++ {
		p.setDone(i-from, p.isDone(i))
	}
	clear(p.done[(n-from+63)/64 : (n+63)/64])
	if r := (n - from) & 63; r != 0 {
		p.done[(n-from)>>6] &= 1<<r - 1
	}
}

// mergeRunsLocked merges each run of adjacent finished entries into one;
// afterwards at most 2*pending+1 entries are outstanding.
func (p *Partition) mergeRunsLocked() {
	n := len(p.entries)
	out := p.entries[:p.head]
	for i := p.head; i < n; i++ {
		e, done := p.entries[i], p.isDone(i)
		if k := len(out); done && k > p.head && p.isDone(k-1) {
			out[k-1].ts, out[k-1].epoch, out[k-1].run = e.last(), e.epoch, true
			continue
		}
		p.setDone(len(out), done)
		out = append(out, e)
	}
	for i := len(out); i < n; i++ {
		p.setDone(i, false)
	}
	clear(p.entries[len(out):])
	p.entries = out
	p.dense = false
}

// Done records that offset's effect is durable and advances the watermark
// over every finished offset at the head. It reports whether the offset was
// outstanding in this assignment; a completion for an unknown offset, a
// repeated completion, or one that arrives after [Partition.Detach] is
// ignored.
func (p *Partition) Done(offset int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.detached || !p.markLocked(offset) {
		return false
	}
	p.advanceLocked()
	return true
}

// DoneAll is Done for several offsets under one lock. It returns how many
// of them were outstanding.
func (p *Partition) DoneAll(offsets []int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.detached {
		return 0
	}
	n := 0
	for _, o := range offsets {
		if p.markLocked(o) {
			n++
		}
	}
	if n > 0 {
		p.advanceLocked()
	}
	return n
}

// markLocked marks offset finished and reports whether it was outstanding.
func (p *Partition) markLocked(offset int64) bool {
	if p.head == len(p.entries) {
		return false
	}
	var i int
	if p.dense {
		// No entry read: offset's index is its distance from the first.
		d := offset - p.entries[0].offset
		if d < int64(p.head) || d >= int64(len(p.entries)) {
			return false
		}
		i = int(d)
	} else {
		live := p.entries[p.head:]
		// Offsets are usually consecutive: try the offset's distance
		// from the head first, then search (finished runs cover several
		// offsets).
		j := int(min(max(offset-live[0].offset, 0), int64(len(live))))
		if j == len(live) || live[j].offset != offset {
			j = sort.Search(len(live), func(i int) bool { return live[i].last() >= offset })
		}
		if j == len(live) || live[j].offset != offset {
			return false
		}
		i = p.head + j
	}
	if p.isDone(i) {
		return false
	}
	p.setDone(i, true)
	p.pending--
	return true
}

// advanceLocked moves the head over the finished offsets.
func (p *Partition) advanceLocked() {
	h := p.head
	for h < len(p.entries) {
		w := ^p.done[h>>6] >> (h & 63) // unfinished entries, from h on
		if w != 0 {
			h = min(h+bits.TrailingZeros64(w), len(p.entries))
			break
		}
		h += 64 - h&63
	}
	h = min(h, len(p.entries))
	if h > p.head {
		e := &p.entries[h-1]
		p.commit = Offset{Epoch: e.epoch, Offset: e.last() + 1}
		p.head = h
	}
}

// Committable returns the offset that is safe to commit: one past the last
// offset of the finished prefix. ok is false when no record of this
// assignment has finished yet.
func (p *Partition) Committable() (o Offset, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.commit, p.commit.Offset >= 0
}

// Position returns where the assignment stands: next is the lowest
// unfinished offset (or, when every added offset is finished, one past the
// last added), oldestTs the timestamp given for it (0 when none is
// unfinished), and pending how many are unfinished. ok is false before any
// offset was added.
func (p *Partition) Position() (next, oldestTs int64, pending int, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lastAdd < 0 {
		return 0, 0, 0, false
	}
	for i := p.head; i < len(p.entries); i++ {
		if !p.isDone(i) {
			return p.entries[i].offset, p.entries[i].ts, p.pending, true
		}
	}
	return p.lastAdd + 1, 0, 0, true
}

// Pending returns how many added offsets are not finished yet.
func (p *Partition) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending
}

// Detach ends this assignment: later Add and Done calls are ignored. It
// returns the committable offset at the time of detaching.
func (p *Partition) Detach() (o Offset, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.detached = true
	return p.commit, p.commit.Offset >= 0
}

// Detached reports whether the assignment has ended.
func (p *Partition) Detached() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.detached
}
