package txn

import (
	"testing"
	"time"
)

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

// After a revoke (endSoon) the open transaction ends at once even though
// nothing joined it; one that came while a transaction was ending makes
// the next one, or the one left open, end at once too. Without a revoke
// an empty transaction never ends.
func TestGateEndsTheTransactionAfterARevoke(t *testing.T) {
	const interval = time.Hour
	due := func(g *gate) bool {
		at := g.endAt(interval)
		return !at.IsZero() && !at.After(time.Now())
	}
	g := newGate(10)
	g.open()
	if !g.endAt(interval).IsZero() {
		t.Fatal("an empty transaction has an end time before any revoke")
	}
	g.endSoon()
	if !due(g) {
		t.Fatalf("after a revoke the empty transaction ends at %v, want now", g.endAt(interval))
	}
	if j := g.shut(); j.first.IsZero() {
		t.Fatal("shut reports an empty transaction after a revoke: the runner would leave it open")
	}
	g.endSoon() // while the transaction ends
	g.open()
	if !due(g) {
		t.Fatal("a revoke while the last transaction ended does not end the next one at once")
	}
	g.shut()
	g.open()
	if !g.endAt(interval).IsZero() {
		t.Fatal("the transaction after that one ends early with no revoke")
	}
	g.shut()
	g.endSoon()
	g.reopen() // nothing joined: the runner leaves the same transaction open
	if !due(g) {
		t.Fatal("a revoke while the runner looked at an empty transaction does not end it")
	}
}
