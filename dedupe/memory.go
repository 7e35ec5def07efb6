package dedupe

import (
	"container/list"
	"context"
	"sync"
	"time"
)

// DefaultMemoryMax is the identities a Memory store keeps by default.
const DefaultMemoryMax = 1_000_000

// Memory is a Store in the process's memory, bounded: past its maximum it
// forgets the identities remembered longest ago, as their windows would.
// It suits tests and a service that runs one instance (its memory ends
// with the process: a restart's redeliveries are not caught). Each
// identity costs about 150 bytes plus its length.
type Memory struct {
	mu    sync.Mutex
	max   int
	now   func() time.Time
	ids   map[string]*list.Element
	order *list.List // of *memEntry, oldest remembered first
}

type memEntry struct {
	id      string
	expires time.Time
}

// NewMemory returns a Memory store that keeps at most max identities
// (0: DefaultMemoryMax).
func NewMemory(max int) *Memory {
	if max <= 0 {
		max = DefaultMemoryMax
	}
	return &Memory{max: max, now: time.Now, ids: map[string]*list.Element{}, order: list.New()}
}

// Seen implements Store.
func (m *Memory) Seen(_ context.Context, ids []string) ([]bool, error) {
	out := make([]bool, len(ids))
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, id := range ids {
		if e, ok := m.ids[id]; ok {
			if now.Before(e.Value.(*memEntry).expires) {
				out[i] = true
			} else {
				m.remove(e)
			}
		}
	}
	return out, nil
}

// Remember implements Store.
func (m *Memory) Remember(_ context.Context, ids []string, ttl time.Duration) error {
	expires := m.now().Add(ttl)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range ids {
		if e, ok := m.ids[id]; ok {
			e.Value.(*memEntry).expires = expires
			m.order.MoveToBack(e)
			continue
		}
		m.ids[id] = m.order.PushBack(&memEntry{id: id, expires: expires})
		for len(m.ids) > m.max {
			m.remove(m.order.Front())
		}
	}
	return nil
}

// Forget implements Store.
func (m *Memory) Forget(_ context.Context, ids []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range ids {
		if e, ok := m.ids[id]; ok {
			m.remove(e)
		}
	}
	return nil
}

// Cleanup implements Cleaner: it frees the entries whose window has
// passed (Seen frees those it meets). It looks at every entry, holding
// the store's lock: about 7ms per million identities.
func (m *Memory) Cleanup(_ context.Context) (int64, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for e := m.order.Front(); e != nil; {
		next := e.Next()
		if !now.Before(e.Value.(*memEntry).expires) {
			m.remove(e)
			n++
		}
		e = next
	}
	return n, nil
}

// Len returns how many identities m holds (some may have expired).
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ids)
}

func (m *Memory) remove(e *list.Element) {
	delete(m.ids, e.Value.(*memEntry).id)
	m.order.Remove(e)
}
