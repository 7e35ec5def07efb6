package consumer

import "testing"

// A wake that comes while no poll waits (between two polls, or before the
// first) is kept for the next poll: the transactional runner acts on it
// instead of waiting for records that may never come.
func TestGateKeepsAWakeBetweenPolls(t *testing.T) {
	g := newGate(10)
	g.mu.Lock()
	g.wake() // no poll registered
	g.mu.Unlock()

	woken := 0
	g.setKick(func() { woken++ })
	if woken != 1 {
		t.Fatalf("the next poll was woken %d times by the kept wake, want 1", woken)
	}
	g.setKick(nil)
	g.setKick(func() { woken++ })
	if woken != 1 {
		t.Fatalf("a kept wake woke %d polls, want only the first", woken)
	}
	g.mu.Lock()
	g.wake()
	g.mu.Unlock()
	if woken != 2 {
		t.Fatal("a wake during a poll did not reach it")
	}
}
