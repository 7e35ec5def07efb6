package lifecycle

import (
	"context"
	"errors"
	"sync"
	"testing"
)

func TestRunOnceCloseStopsAndWaits(t *testing.T) {
	var s State
	ctx, end, err := s.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		<-ctx.Done() // Close cancels the run
		end()
		close(done)
	}()
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); s.Close() }()
	}
	wg.Wait()
	select {
	case <-done:
	default:
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
