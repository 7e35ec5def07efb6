// Package lifecycle is the run-once, close-any-time state that kscope's
// runners share: Run may be called once, Close stops a running Run and waits
// for it, and both are safe in any order and concurrently.
package lifecycle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// ErrUsed is returned by Begin on a runner that already ran or was closed.
var ErrUsed = errors.New("kscope: Runner.Run called on a runner that already ran or was closed; create a new Runner")

// State is embedded by a runner. Its zero value is ready to use.
type State struct {
	used     atomic.Bool
	mu       sync.Mutex
	stop     context.CancelFunc
	closed   bool // Close was called: a Run that is still starting stops at once
	finished chan struct{}
	once     sync.Once
}

func (s *State) init() { s.once.Do(func() { s.finished = make(chan struct{}) }) }

// Begin starts a Run: it returns the run's context, canceled by Close, and
// the function Run must defer to mark its end. It returns ErrUsed when the
// runner already ran or was closed.
func (s *State) Begin(ctx context.Context) (context.Context, func(), error) {
	s.init()
	if !s.used.CompareAndSwap(false, true) {
		return nil, nil, ErrUsed
	}
	ctx, stop := context.WithCancel(ctx)
	s.mu.Lock()
	s.stop = stop
	if s.closed {
		stop() // Close came between the check above and here
	}
	s.mu.Unlock()
	return ctx, func() { stop(); close(s.finished) }, nil
}

// Stop cancels the running Run's context without waiting for it.
func (s *State) Stop() {
	s.mu.Lock()
	stop := s.stop
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Close stops a running Run and waits for it to return; on a runner that
// never ran it makes a later Run fail with ErrUsed. It is idempotent.
func (s *State) Close() error {
	s.init()
	if s.used.CompareAndSwap(false, true) {
		close(s.finished)
		return nil
	}
	s.mu.Lock()
	s.closed = true
	stop := s.stop
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	<-s.finished
	return nil
}
