package txn

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/sequence"
)

// The Kafka scope's version state of the partitions a member owns:
// assignment, expiry of parked records, and restore.

// versionStore is the Kafka scope's version state: one partVersions per
// owned input partition, restored from the changelog on first use after
// the partition is assigned.
type versionStore struct {
	cfg   sequence.Config
	group string
	kcfg  consumer.Config

	mu    sync.Mutex
	parts map[tp]*partVersions
	// snap is a copy of parts, replaced (under mu) whenever parts
	// changes: get, which every record calls, reads it without a lock.
	snap  atomic.Pointer[map[tp]*partVersions]
	owned map[tp]uint64 // assigned partitions and their assignment's generation
	gen   uint64
	kick  func()

	expiringSet map[*parkedRec]bool // parked records dispatched to be expired

	restoreErr error // the last restore's failure; nil once one succeeded
}

// assigned notes newly assigned partitions once the group's offsets of
// them have been fetched stably (so no transaction of a previous owner is
// still pending on them): the poll loop restores their state before it
// handles any of their records.
func (s *versionStore) assigned(ps map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for t, parts := range ps {
		for _, p := range parts {
			s.gen++
			s.owned[tp{t, p}] = s.gen
			delete(s.parts, tp{t, p})
		}
	}
	s.snapshot()
	if s.kick != nil {
		s.kick()
	}
}

// missing returns the owned input partitions whose state is not loaded,
// with their assignment generation.
func (s *versionStore) missing(inputs []string) map[tp]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out map[tp]uint64
	for k, gen := range s.owned {
		if s.parts[k] != nil || !slices.Contains(inputs, k.topic) {
			continue
		}
		if out == nil {
			out = map[tp]uint64{}
		}
		out[k] = gen
	}
	return out
}

// setKick registers the function that wakes the poll loop when partitions
// are assigned, so that they are restored (and their parked records time
// out) even before records arrive.
func (s *versionStore) setKick(f func()) {
	s.mu.Lock()
	s.kick = f
	pending := len(s.owned) > 0
	s.mu.Unlock()
	if pending {
		f() // partitions were assigned before the runner could be woken
	}
}

// takeExpired returns the parked records of every owned partition that
// have waited past GapTimeout and are not being expired already, and notes
// them as being expired.
func (s *versionStore) takeExpired(now time.Time) []*parkedRec {
	var out []*parkedRec
	for _, pv := range s.all() {
		for _, p := range pv.expired(now, s.cfg.GapTimeout) {
			s.mu.Lock()
			if !s.expiringSet[p] {
				s.expiringSet[p] = true
				out = append(out, p)
			}
			s.mu.Unlock()
		}
	}
	return out
}

// expiring notes whether p is being expired by a worker.
func (s *versionStore) expiring(p *parkedRec, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.expiringSet[p] = true
	} else {
		delete(s.expiringSet, p)
	}
}

// nextExpiry returns when the next parked record that is not being
// expired times out (zero if none).
func (s *versionStore) nextExpiry() time.Time {
	var next time.Time
	for _, pv := range s.all() {
		s.mu.Lock()
		skip := s.expiringSet
		at := pv.nextExpiry(s.cfg.GapTimeout, skip)
		s.mu.Unlock()
		if !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return next
}

func (s *versionStore) get(k tp) *partVersions {
	if m := s.snap.Load(); m != nil {
		return (*m)[k]
	}
	return nil
}

// snapshot publishes parts to get. s.mu is held.
func (s *versionStore) snapshot() {
	m := maps.Clone(s.parts)
	s.snap.Store(&m)
}

// each returns the owned partitions' state, by partition.
func (s *versionStore) each() map[tp]*partVersions {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.parts)
}

func (s *versionStore) all() []*partVersions {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*partVersions, 0, len(s.parts))
	for _, pv := range s.parts {
		out = append(out, pv)
	}
	return out
}

// drop forgets the state of partitions this member no longer owns: their
// next owner restores it from the changelog, and so does this member if
// they come back.
func (s *versionStore) drop(ps map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for t, parts := range ps {
		for _, p := range parts {
			delete(s.parts, tp{t, p})
			delete(s.owned, tp{t, p})
		}
	}
	s.snapshot()
}

// end commits or drops every partition's pending changes.
func (s *versionStore) end(committed bool) {
	for _, pv := range s.all() {
		pv.end(committed)
	}
}

// restore loads the state of the partitions in need from their changelogs,
// read_committed up to the last stable offset. A partition revoked or
// reassigned meanwhile (its generation changed) is not installed.
func (s *versionStore) restore(ctx context.Context, need map[tp]uint64) error {
	if len(need) == 0 {
		return nil
	}
	state, err := readState(ctx, s.kcfg, s.group, slices.Collect(maps.Keys(need)))
	if err != nil {
		if ctx.Err() == nil {
			s.mu.Lock()
			s.restoreErr = err
			s.mu.Unlock()
		}
		return err
	}
	s.mu.Lock()
	s.restoreErr = nil
	for k, pv := range state {
		if s.owned[k] == need[k] {
			s.parts[k] = pv
		}
	}
	s.snapshot()
	s.mu.Unlock()
	return nil
}

// waiting says, for Stats.Waiting (and so for readiness), how many of the
// assigned input partitions have no state restored from their changelog
// yet, with the last restore's failure; empty when every one has it.
// assigned are the partitions the member was assigned, from the moment it
// was (before their offsets are fetched): a member is not ready between
// its assignment and the end of the restore.
func (s *versionStore) waiting(assigned []tp) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range assigned {
		if s.parts[k] == nil {
			n++
		}
	}
	if n == 0 {
		return ""
	}
	why := fmt.Sprintf("the versions of %d of the %d assigned partitions are being restored from their changelogs", n, len(assigned))
	if s.restoreErr != nil {
		why += "; the last attempt failed (retrying): " + s.restoreErr.Error()
	}
	return why
}
