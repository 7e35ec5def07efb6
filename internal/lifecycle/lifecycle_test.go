package lifecycle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRunOnceCloseStopsAndWaits(t *testing.T) {
	var s State
	ctx, end, err := s.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// ending is set before the run's end: a Close that waits for the end
	// returns after it. (Set after end, it raced a Close that waited: the
	// CI once saw Close return between the two.)
	var ending atomic.Bool
	go func() {
		<-ctx.Done() // Close cancels the run
		ending.Store(true)
		end()
	}()
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); s.Close() }()
	}
	wg.Wait()
	if !ending.Load() {
		t.Fatal("Close returned before the run ended")
	}
	if _, _, err := s.Begin(context.Background()); !errors.Is(err, ErrUsed) {
		t.Fatalf("second Begin: %v", err)
	}
}

func TestCloseBeforeBegin(t *testing.T) {
	var s State
	s.Close()
	s.Close()
	if _, _, err := s.Begin(context.Background()); !errors.Is(err, ErrUsed) {
		t.Fatalf("Begin after Close: %v", err)
	}
}

// Close racing the start of Run stops it: it never waits for the Run's own
// context to end.
func TestCloseRacingBegin(t *testing.T) {
	for range 2000 {
		var s State
		started := make(chan struct{})
		go func() {
			ctx, end, err := s.Begin(context.Background()) // a context that never ends
			close(started)
			if err != nil {
				return
			}
			<-ctx.Done()
			end()
		}()
		closed := make(chan struct{})
		go func() { s.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("Close racing Begin waited for the run's own context")
		}
		<-started
	}
}
