package main

import (
	"slices"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/sequence"
)

// The policy the service ships is valid, and the runners are built from
// it: the ledger's short ladder, its gap policy, the notifier's retries in
// place.
func TestServicePolicy(t *testing.T) {
	if err := checkPolicy(); err != nil {
		t.Fatal(err)
	}
	fail, err := failures()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fail.Ladder, []time.Duration{time.Second, 2 * time.Second}) || fail.InPlaceAttempts != 2 ||
		fail.Backoff != 50*time.Millisecond || fail.MaxBackoff != time.Second || fail.DeadLetterRetention != 720*time.Hour {
		t.Fatalf("the ledger's failure policy: %+v", fail)
	}
	o, err := options(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.Versions == nil || o.Versions.Gaps != sequence.Wait || o.Versions.GapTimeout != 10*time.Minute {
		t.Fatalf("the ledger's versions: %+v", o.Versions)
	}
	n, err := entry("notifications", notifierGroup)
	if err != nil || !n.Failures.DisableRetryTopics || !n.Replay {
		t.Fatalf("notifications: %+v, %v", n, err)
	}
}
