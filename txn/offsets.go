package txn

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/partition"
)

// maxUndone bounds the records of one partition that are dispatched and not
// done. Records of a partition finish out of order (another key's record
// may retry in place while later ones commit), and the offset committed
// for a partition cannot pass its lowest unfinished record; so that the
// records after it are not handled again after a crash, the transaction
// also commits, in the offset's metadata, which records above the offset
// are unfinished: at most maxUndone of them, a few kilobytes at most,
// below the broker's offset.metadata.max.bytes (4096 by default).
const maxUndone = 256

// metaPrefix starts the offset metadata kscope writes: the version of the
// encoding that follows.
const metaPrefix = "kscope1:"

// encodeDone encodes "every record in [w, end) is done except the ones in
// undone" (undone sorted, each in [w, end)) as offset commit metadata:
// uvarints of end-w, len(undone) and the gaps between w and the undone
// offsets, in base64.
func encodeDone(w, end int64, undone []int64) string {
	if end <= w {
		return ""
	}
	b := binary.AppendUvarint(nil, uint64(end-w))
	b = binary.AppendUvarint(b, uint64(len(undone)))
	prev := w
	for _, u := range undone {
		b = binary.AppendUvarint(b, uint64(u-prev))
		prev = u
	}
	return metaPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// decodeDone decodes what encodeDone wrote for committed offset w. Metadata
// that kscope did not write (another tool's, or none) means nothing above
// w is done.
func decodeDone(w int64, meta string) (end int64, undone []int64, err error) {
	if !strings.HasPrefix(meta, metaPrefix) {
		return w, nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(meta[len(metaPrefix):])
	if err != nil {
		return w, nil, err
	}
	next := func() (uint64, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, errors.New("truncated")
		}
		b = b[n:]
		return v, nil
	}
	span, err := next()
	if err != nil {
		return w, nil, err
	}
	n, err := next()
	if err != nil || n > uint64(len(b)) {
		return w, nil, errors.New("truncated")
	}
	prev := w
	for range n {
		d, err := next()
		if err != nil {
			return w, nil, err
		}
		prev += int64(d)
		undone = append(undone, prev)
	}
	return w + int64(span), undone, nil
}

// partState tracks one assigned input partition: which of its records are
// done (their outputs or route are in a committed transaction, or in the
// open one) and which are not, so that each transaction can commit the
// partition's offset at its lowest unfinished record with, in the
// metadata, the finished records above it.
//
// Records are delivered by the poll loop in offset order; those that the
// committed state says are done are skipped. The others are dispatched to
// the key-shard workers, at most maxUndone at a time (the rest wait in a
// backlog), and each becomes done when its worker joins a transaction
// with its outputs. When a transaction aborts, the partition is rewound to
// its committed state: every record not done there is delivered again.
type partState struct {
	topic     string
	partition int32
	a         *partition.Assignment
	dispatch  func(p *partState, rec *kgo.Record) // queues rec on its key-shard worker
	backlogs  *atomic.Int64                       // records waiting in every partition's backlog

	mu sync.Mutex
	// The committed state: the committed offset and, above it, the end of
	// the range whose records are done except the undone ones. known is
	// false until an offset is committed or a record delivered.
	known   bool
	cW, cE  int64
	cUndone []int64

	epoch    uint64         // bumped at every rewind; work of an older epoch is dropped
	next     int64          // the offset after the last delivered record
	pending  map[int64]bool // delivered records not done
	inflight int            // of which dispatched to workers
	backlog  []*kgo.Record  // of which waiting for a dispatch slot, in offset order
	maxDone  int64          // the highest offset done since the last rewind, -1 if none
	gone     bool           // revoked or lost
}

func newPartState(topic string, p int32, a *partition.Assignment, dispatch func(*partState, *kgo.Record), backlogs *atomic.Int64) *partState {
	return &partState{topic: topic, partition: p, a: a, dispatch: dispatch, backlogs: backlogs, pending: map[int64]bool{}, maxDone: -1}
}

// setCommitted installs the committed offset and metadata fetched for the
// partition when it was assigned.
func (p *partState) setCommitted(offset int64, meta string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if offset < 0 {
		return nil // nothing committed: known at the first record
	}
	end, undone, err := decodeDone(offset, meta)
	if err != nil {
		end, undone = offset, nil
	}
	p.known, p.cW, p.cE, p.cUndone, p.next = true, offset, max(end, offset), undone, offset
	return err
}

// current reports whether work of epoch is still wanted.
func (p *partState) current(epoch uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.gone && p.epoch == epoch
}

// deliver takes a polled record: it is skipped if it is done already, else
// dispatched or, past the bound, kept in the backlog. It reports whether
// the record was skipped as done.
func (p *partState) deliver(rec *kgo.Record) (skipped bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := rec.Offset
	if p.gone {
		return false
	}
	if !p.known {
		p.known, p.cW, p.cE, p.next = true, o, o, o
	}
	if o < p.next || o < p.cW || (o < p.cE && !slices.Contains(p.cUndone, o)) {
		return true // delivered already in this epoch, or done in the committed state
	}
	p.next = max(p.next, o+1)
	p.pending[o] = true
	if p.inflight < maxUndone && len(p.backlog) == 0 {
		p.inflight++
		p.dispatch(p, rec)
		return false
	}
	p.backlog = append(p.backlog, rec)
	p.backlogs.Add(1)
	return false
}

// done notes that the record at offset o of epoch joined the open
// transaction, and dispatches what its slot lets out of the backlog.
func (p *partState) done(epoch uint64, o int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone || p.epoch != epoch || !p.pending[o] {
		return
	}
	delete(p.pending, o)
	p.inflight--
	p.maxDone = max(p.maxDone, o)
	for p.inflight < maxUndone && len(p.backlog) > 0 {
		rec := p.backlog[0]
		p.backlog[0] = nil
		p.backlog = p.backlog[1:]
		p.backlogs.Add(-1)
		p.inflight++
		p.dispatch(p, rec)
	}
}

// commitPoint returns the offset and metadata a transaction that ends now
// commits for the partition, and whether they differ from the committed
// ones.
func (p *partState) commitPoint() (w int64, meta string, end int64, undone []int64, changed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.known || p.gone {
		return 0, "", 0, nil, false
	}
	for o := range p.pending {
		undone = append(undone, o)
	}
	for _, u := range p.cUndone {
		if u >= p.next {
			undone = append(undone, u)
		}
	}
	slices.Sort(undone)
	undone = slices.Compact(undone)
	w = max(p.next, p.cE)
	if len(undone) > 0 {
		w = min(w, undone[0])
	}
	end = max(p.cE, p.maxDone+1, w)
	i := 0
	for i < len(undone) && undone[i] < end {
		i++
	}
	undone = undone[:i]
	meta = encodeDone(w, end, undone)
	changed = w != p.cW || end != p.cE || !slices.Equal(undone, p.cUndone)
	return w, meta, end, undone, changed
}

// committed installs what a committed transaction committed.
func (p *partState) committed(w, end int64, undone []int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cW, p.cE, p.cUndone = w, end, undone
}

// rewind drops every record not done in the committed state (they are
// delivered again from the committed offset, which it returns) and makes
// the work of the old epoch stale.
func (p *partState) rewind() (int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.epoch++
	clear(p.pending)
	p.inflight = 0
	p.backlogs.Add(-int64(len(p.backlog)))
	p.backlog = nil
	p.maxDone = -1
	if !p.known || p.gone {
		return 0, false
	}
	p.next = p.cW
	return p.cW, true
}

// leave marks the partition revoked or lost: its queued and running work
// is dropped.
func (p *partState) leave() {
	p.mu.Lock()
	p.gone = true
	p.backlogs.Add(-int64(len(p.backlog)))
	p.backlog = nil
	p.mu.Unlock()
	p.a.Revoke()
	p.a.Cancel()
}
