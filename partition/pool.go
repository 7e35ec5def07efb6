package partition

import (
	"context"
	"sync"
	"time"
)

// ProcessFunc handles a batch of records of one assignment, in order, on one
// shard's worker. Batches of one shard never run concurrently.
type ProcessFunc[T any] func(ctx context.Context, a *Assignment, batch []T)

// DropFunc is told about a record that was dispatched but will never be
// processed because its assignment was revoked or the pool stopped first.
type DropFunc[T any] func(a *Assignment, v T)

// PoolConfig configures a [Pool].
type PoolConfig[T any] struct {
	Shards   int            // number of serial workers; must be positive
	BatchMax int            // most records per batch; values below 1 mean 1
	Linger   time.Duration  // how long a worker waits to fill a batch; 0 waits not at all
	Process  ProcessFunc[T] // required
	Drop     DropFunc[T]    // optional
}

type item[T any] struct {
	a *Assignment
	v T
}

type shard[T any] struct {
	mu     sync.Mutex
	q      []item[T]
	head   int
	wake   chan struct{}
	closed bool
}

// Pool runs one serial worker per shard. It owns its goroutines: [Pool.Stop]
// returns after every one of them has exited.
type Pool[T any] struct {
	cfg    PoolConfig[T]
	shards []*shard[T]
	wg     sync.WaitGroup
	once   sync.Once
}

// NewPool returns a pool whose workers start with [Pool.Start].
func NewPool[T any](cfg PoolConfig[T]) *Pool[T] {
	if cfg.BatchMax < 1 {
		cfg.BatchMax = 1
	}
	p := &Pool[T]{cfg: cfg, shards: make([]*shard[T], cfg.Shards)}
	for i := range p.shards {
		p.shards[i] = &shard[T]{wake: make(chan struct{}, 1)}
	}
	return p
}

// Shards returns the number of shards.
func (p *Pool[T]) Shards() int { return len(p.shards) }

// Start starts the workers. Batches run under the context of their
// assignment.
func (p *Pool[T]) Start() {
	for _, s := range p.shards {
		p.wg.Add(1)
		go p.work(s)
	}
}

// Dispatch queues v, a record of assignment a, on shard i. It never blocks.
// A record dispatched after Stop, or for a revoked assignment, is dropped.
func (p *Pool[T]) Dispatch(i int, a *Assignment, v T) {
	p.DispatchAll(i, a, []T{v})
}

// DispatchAll queues vs, records of assignment a in offset order, on shard
// i, as many calls of Dispatch would, under one lock and with one wake-up.
func (p *Pool[T]) DispatchAll(i int, a *Assignment, vs []T) {
	s := p.shards[i]
	s.mu.Lock()
	if s.closed || a.Revoked() {
		s.mu.Unlock()
		if p.cfg.Drop != nil {
			for _, v := range vs {
				p.cfg.Drop(a, v)
			}
		}
		return
	}
	if s.head > 64 && s.head*2 >= len(s.q) {
		n := copy(s.q, s.q[s.head:])
		clear(s.q[n:])
		s.q, s.head = s.q[:n], 0
	}
	for _, v := range vs {
		s.q = append(s.q, item[T]{a, v})
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Purge removes every queued record of assignment a (which should be revoked
// first, so that none is queued again) and reports each to the pool's
// DropFunc. Records of a that a worker already took are not affected.
func (p *Pool[T]) Purge(a *Assignment) {
	for _, s := range p.shards {
		var dropped []item[T]
		s.mu.Lock()
		live := s.q[s.head:]
		kept := live[:0]
		for _, it := range live {
			if it.a == a {
				dropped = append(dropped, it)
				continue
			}
			kept = append(kept, it)
		}
		clear(live[len(kept):])
		s.q = s.q[:s.head+len(kept)]
		s.mu.Unlock()
		if p.cfg.Drop != nil {
			for _, it := range dropped {
				p.cfg.Drop(it.a, it.v)
			}
		}
	}
}

// Stop drops every queued record, waits for the running batches to return,
// and returns once every worker has exited. It is idempotent.
func (p *Pool[T]) Stop() {
	p.once.Do(func() {
		for _, s := range p.shards {
			s.mu.Lock()
			s.closed = true
			dropped := append([]item[T](nil), s.q[s.head:]...)
			s.q, s.head = nil, 0
			s.mu.Unlock()
			close(s.wake)
			if p.cfg.Drop != nil {
				for _, it := range dropped {
					p.cfg.Drop(it.a, it.v)
				}
			}
		}
	})
	p.wg.Wait()
}

func (p *Pool[T]) work(s *shard[T]) {
	defer p.wg.Done()
	var batch []T
	for {
		a, ok := p.take(s, &batch)
		if !ok {
			return
		}
		if a == nil {
			continue
		}
		p.cfg.Process(a.Context(), a, batch)
		a.exit(len(batch))
		clear(batch)
		batch = batch[:0]
	}
}

// take fills batch with queued records of one assignment, waiting for the
// first one, and for up to Linger for more. It returns ok=false when the
// pool stopped, and a nil assignment when what it found was revoked.
func (p *Pool[T]) take(s *shard[T], batch *[]T) (*Assignment, bool) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, false
		}
		if s.head < len(s.q) {
			break
		}
		s.q, s.head = s.q[:0], 0
		s.mu.Unlock()
		if _, open := <-s.wake; !open {
			return nil, false
		}
	}
	// s.mu is held and the queue is not empty.
	var dropped []item[T]
	a := s.q[s.head].a
	for a.Revoked() {
		dropped = append(dropped, s.q[s.head])
		s.q[s.head] = item[T]{}
		s.head++
		if s.head == len(s.q) {
			s.mu.Unlock()
			p.drop(dropped)
			return nil, true
		}
		a = s.q[s.head].a
	}
	p.fill(s, a, batch)
	a.enter(len(*batch))
	s.mu.Unlock()
	p.drop(dropped)

	if p.cfg.Linger <= 0 || len(*batch) >= p.cfg.BatchMax {
		return a, true
	}
	deadline := time.NewTimer(p.cfg.Linger)
	defer deadline.Stop()
	for len(*batch) < p.cfg.BatchMax {
		select {
		case _, open := <-s.wake:
			if !open {
				return a, true
			}
		case <-deadline.C:
			return a, true
		}
		s.mu.Lock()
		if s.closed || a.Revoked() {
			s.mu.Unlock()
			return a, true
		}
		n := len(*batch)
		p.fill(s, a, batch)
		a.enter(len(*batch) - n)
		next := s.head < len(s.q)
		s.mu.Unlock()
		if next {
			// The queue holds another assignment's record: stop
			// lingering so that it is not held back.
			return a, true
		}
	}
	return a, true
}

// fill moves queued records of a into batch, in their order, up to
// BatchMax: those at the head of the queue, then those queued behind other
// assignments' records, within gatherWindow batches' worth of the queue.
// The records left keep their order. A shard's queue interleaves the runs
// of every partition a poll returned records of, so a batch of its first
// run alone would hold a poll's records of one partition on one shard,
// however many polls are queued; a scope pays its per-batch cost (a
// database transaction, its commit) that many times more. Records of
// different assignments have no order among them to keep: they come from
// different partitions, fetched apart. s.mu must be held.
func (p *Pool[T]) fill(s *shard[T], a *Assignment, batch *[]T) {
	for s.head < len(s.q) && len(*batch) < p.cfg.BatchMax && s.q[s.head].a == a {
		*batch = append(*batch, s.q[s.head].v)
		s.q[s.head] = item[T]{}
		s.head++
	}
	if len(*batch) >= p.cfg.BatchMax || s.head == len(s.q) {
		return
	}
	// Gather: the kept records are written down from the head as the
	// scan goes, then moved up against the unscanned rest.
	end := min(len(s.q), s.head+gatherWindow*p.cfg.BatchMax)
	w, i := s.head, s.head
	for ; i < end && len(*batch) < p.cfg.BatchMax; i++ {
		if it := s.q[i]; it.a == a {
			*batch = append(*batch, it.v)
		} else {
			s.q[w] = it
			w++
		}
	}
	if w == i {
		return // none of a's past the head
	}
	kept := w - s.head
	copy(s.q[i-kept:i], s.q[s.head:w])
	clear(s.q[s.head : i-kept])
	s.head = i - kept
}

// gatherWindow bounds, in batches of BatchMax, how far past the head fill
// looks for an assignment's records, and so the copying a batch costs.
const gatherWindow = 8

func (p *Pool[T]) drop(items []item[T]) {
	if p.cfg.Drop == nil {
		return
	}
	for _, it := range items {
		p.cfg.Drop(it.a, it.v)
	}
}
