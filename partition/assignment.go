package partition

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/kscope-dev/kscope/commit"
)

// Assignment is one assignment of one topic partition to this group member:
// it is created when the partition is assigned and ended when it is revoked
// or lost. A partition assigned again later gets a new Assignment, so work
// left over from the old one can always be told apart.
type Assignment struct {
	Topic     string
	Partition int32
	// Watermark tracks which of this assignment's offsets are durable.
	Watermark *commit.Partition

	ctx    context.Context
	cancel context.CancelFunc

	// revoked is read for every record a worker starts: it has a cache
	// line of its own, away from mu, which changes with every batch.
	_       [64]byte
	revoked atomic.Bool
	_       [63]byte

	revokedCh chan struct{} // closed by Revoke

	mu      sync.Mutex
	running int
	idle    chan struct{}
}

// NewAssignment returns the assignment of the partition that wm tracks. Its
// context, which handlers of its records run under, is derived from parent
// and is canceled by [Assignment.Cancel].
func NewAssignment(parent context.Context, wm *commit.Partition) *Assignment {
	ctx, cancel := context.WithCancel(parent)
	return &Assignment{
		Topic:     wm.Topic,
		Partition: wm.Partition,
		Watermark: wm,
		ctx:       ctx,
		cancel:    cancel,
		revokedCh: make(chan struct{}),
	}
}

// Context is canceled when the assignment's records must stop: the partition
// was lost, its drain timeout passed, or the consumer stopped.
func (a *Assignment) Context() context.Context { return a.ctx }

// Cancel cancels the assignment's context.
func (a *Assignment) Cancel() { a.cancel() }

// Revoke marks the assignment as ended: no queued record of it starts after
// Revoke returns. Records already running are not interrupted; see
// [Assignment.WaitIdle].
func (a *Assignment) Revoke() {
	if a.revoked.CompareAndSwap(false, true) {
		close(a.revokedCh)
	}
}

// RevokedCh returns a channel that is closed by [Assignment.Revoke]: a
// worker waiting between attempts of a record (a retry backoff) selects on
// it, so that a revoke or a shutdown does not wait for the backoff.
func (a *Assignment) RevokedCh() <-chan struct{} { return a.revokedCh }

// Revoked reports whether [Assignment.Revoke] was called.
func (a *Assignment) Revoked() bool { return a.revoked.Load() }

// Running returns how many of the assignment's records a worker has taken and
// not yet finished.
func (a *Assignment) Running() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.running
}

// WaitIdle waits until no record of the assignment is running, or ctx is
// done (then it returns ctx's error).
func (a *Assignment) WaitIdle(ctx context.Context) error {
	a.mu.Lock()
	if a.running == 0 {
		a.mu.Unlock()
		return nil
	}
	if a.idle == nil {
		a.idle = make(chan struct{})
	}
	ch := a.idle
	a.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *Assignment) enter(n int) {
	a.mu.Lock()
	a.running += n
	a.mu.Unlock()
}

func (a *Assignment) exit(n int) {
	a.mu.Lock()
	a.running -= n
	if a.running == 0 && a.idle != nil {
		close(a.idle)
		a.idle = nil
	}
	a.mu.Unlock()
}
