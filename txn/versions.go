package txn

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
)

// The version state of one input partition, the parked records in it, and
// the changelog records that hold them.

// VersionsTopic is the compacted changelog topic that holds, for consumer
// group group, the last applied version of every key of input topic topic
// and the records parked behind a version gap. Its partition p holds the
// keys of the input's partition p, so the member that owns an input
// partition owns its versions: it writes them in the same transaction as
// the outputs and restores them when the partition is assigned to it.
func VersionsTopic(group, topic string) string {
	return group + ".kscope-versions." + topic
}

// Changelog record keys: 'v' + key holds the last applied version (a
// decimal); 'p' + 8-byte big-endian version + key holds a parked record (a
// JSON parkedRec), deleted by a tombstone when it leaves the park.
const (
	kindVersion = 'v'
	kindParked  = 'p'
)

// parkedRec is a record waiting for the versions before it.
type parkedRec struct {
	Version   int64              `json:"version"`
	Topic     string             `json:"topic"`
	Partition int32              `json:"partition"`
	Offset    int64              `json:"offset"`
	Timestamp time.Time          `json:"timestamp"`
	Key       []byte             `json:"key"`
	Value     []byte             `json:"value"`
	Headers   []kgo.RecordHeader `json:"headers"`
	Since     time.Time          `json:"since"` // when it was first parked
	// Others are the other records of the key with the same version
	// (another source record, another identity) that arrived while it
	// waited, in arrival order. They share its changelog record and its
	// fate: when it is released, the first of them that is applied (or
	// skipped) applies the version and the rest are stale; when it times
	// out, they go to the dead-letter topic with it.
	Others []*parkedRec `json:"others,omitempty"`
}

func (p *parkedRec) record() *consumer.Record {
	return &consumer.Record{Record: &kgo.Record{
		Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, Timestamp: p.Timestamp,
		Key: p.Key, Value: p.Value, Headers: p.Headers,
	}}
}

// all returns p and the records parked with it, in arrival order.
func (p *parkedRec) all() []*parkedRec {
	return append([]*parkedRec{p}, p.Others...)
}

// holds reports whether rec is p or one of the records parked with it
// delivered again: the same source record (topic, partition, offset), or
// the same identity.
func (p *parkedRec) holds(rec *consumer.Record, id consumer.Identity) bool {
	rid := id.Of(rec)
	for _, c := range p.all() {
		if c.Topic == rec.Topic && c.Partition == rec.Partition && c.Offset == rec.Offset {
			return true
		}
		if id.Of(c.record()) == rid {
			return true
		}
	}
	return false
}

// with returns a copy of p with o parked with it, last.
func (p *parkedRec) with(o *parkedRec) *parkedRec {
	q := *p
	q.Others = append(slices.Clip(p.Others), o)
	return &q
}

func parkedKey(key []byte, v int64) []byte {
	b := make([]byte, 0, 9+len(key))
	b = append(b, kindParked)
	b = binary.BigEndian.AppendUint64(b, uint64(v))
	return append(b, key...)
}

// partVersions is the version state of one input partition: what the
// changelog holds (committed) and what the open transaction changed
// (pending), which becomes committed only when the transaction does.
type partVersions struct {
	mu      sync.Mutex
	last    map[string]int64
	parked  map[string]map[int64]*parkedRec
	pLast   map[string]int64
	pParked map[string]map[int64]*parkedRec // a nil entry: removed in this transaction
	ids     atomic.Pointer[idMemory]        // the idempotency guard's (Options.Dedupe); nil until used
}

func newPartVersions() *partVersions {
	return &partVersions{
		last: map[string]int64{}, parked: map[string]map[int64]*parkedRec{},
		pLast: map[string]int64{}, pParked: map[string]map[int64]*parkedRec{},
	}
}

func (pv *partVersions) lastOf(key string) (int64, bool) {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if v, ok := pv.pLast[key]; ok {
		return v, true
	}
	v, ok := pv.last[key]
	return v, ok
}

func (pv *partVersions) setLast(key string, v int64) {
	pv.mu.Lock()
	pv.pLast[key] = v
	pv.mu.Unlock()
}

func (pv *partVersions) parkedAt(key string, v int64) *parkedRec {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if m, ok := pv.pParked[key]; ok {
		if p, ok := m[v]; ok {
			return p // nil when removed in this transaction
		}
	}
	return pv.parked[key][v]
}

// lowestParked returns the parked record of key with the lowest version
// (those of this transaction included), or nil.
func (pv *partVersions) lowestParked(key string) *parkedRec {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	var low *parkedRec
	consider := func(v int64, p *parkedRec) {
		if p != nil && (low == nil || v < low.Version) {
			low = p
		}
	}
	pend := pv.pParked[key]
	for v, p := range pv.parked[key] {
		if q, ok := pend[v]; ok {
			p = q // changed (or removed: nil) in this transaction
		}
		consider(v, p)
	}
	for v, p := range pend {
		consider(v, p)
	}
	return low
}

func (pv *partVersions) setParked(key string, v int64, p *parkedRec) {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if pv.pParked[key] == nil {
		pv.pParked[key] = map[int64]*parkedRec{}
	}
	pv.pParked[key][v] = p
}

// end makes the transaction's changes committed, or drops them.
func (pv *partVersions) end(committed bool) {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if committed {
		for k, v := range pv.pLast {
			pv.last[k] = v
		}
		for k, m := range pv.pParked {
			for v, p := range m {
				pv.applyParked(k, v, p)
			}
		}
	}
	clear(pv.pLast)
	clear(pv.pParked)
	if m := pv.ids.Load(); m != nil {
		m.end(committed)
	}
}

func (pv *partVersions) applyParked(key string, v int64, p *parkedRec) {
	if p == nil {
		delete(pv.parked[key], v)
		if len(pv.parked[key]) == 0 {
			delete(pv.parked, key)
		}
		return
	}
	if pv.parked[key] == nil {
		pv.parked[key] = map[int64]*parkedRec{}
	}
	pv.parked[key][v] = p
}

// expired returns the committed parked records that have waited longer
// than timeout.
func (pv *partVersions) expired(now time.Time, timeout time.Duration) []*parkedRec {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	var out []*parkedRec
	for _, m := range pv.parked {
		for _, p := range m {
			if now.Sub(p.Since) > timeout {
				out = append(out, p)
			}
		}
	}
	return out
}

// nextExpiry returns when the next parked record times out (zero if none).
func (pv *partVersions) nextExpiry(timeout time.Duration, skip map[*parkedRec]bool) time.Time {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	var next time.Time
	for _, m := range pv.parked {
		for _, p := range m {
			if skip[p] {
				continue
			}
			if at := p.Since.Add(timeout); next.IsZero() || at.Before(next) {
				next = at
			}
		}
	}
	return next
}

// apply loads one changelog record.
func (pv *partVersions) apply(r *kgo.Record) error {
	if len(r.Key) == 0 {
		return errors.New("empty key")
	}
	switch r.Key[0] {
	case kindVersion:
		if r.Value == nil {
			delete(pv.last, string(r.Key[1:]))
			return nil
		}
		v, err := strconv.ParseInt(string(r.Value), 10, 64)
		if err != nil {
			return fmt.Errorf("version %q: %w", r.Value, err)
		}
		pv.last[string(r.Key[1:])] = v
	case kindParked:
		if len(r.Key) < 9 {
			return errors.New("short parked key")
		}
		v := int64(binary.BigEndian.Uint64(r.Key[1:9]))
		key := string(r.Key[9:])
		if r.Value == nil {
			pv.applyParked(key, v, nil)
			return nil
		}
		var p parkedRec
		if err := json.Unmarshal(r.Value, &p); err != nil {
			return fmt.Errorf("parked record: %w", err)
		}
		pv.applyParked(key, v, &p)
	case kindDedupe:
		seq, ms, ids, err := parseSegment(r.Key, r.Value)
		if err != nil {
			return err
		}
		pv.idsOf().load(seq, ms, ids)
	default:
		return fmt.Errorf("unknown record kind %q", r.Key[0])
	}
	return nil
}
