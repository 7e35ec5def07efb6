package dbscope

import (
	"testing"

	"github.com/kscope-dev/kscope/retrytopic"
)

// The plain insert is for first deliveries only, and not for checkedFor
// after it met an id already in the inbox.
func TestInboxInsertChoice(t *testing.T) {
	var in inboxInsert
	first := []retrytopic.Metadata{{Stage: -1}, {Stage: -1}}
	if !in.usePlain(first) {
		t.Fatal("a batch of first deliveries does not take the plain insert")
	}
	if in.usePlain(append(first, retrytopic.Metadata{Attempt: 2, Stage: 0})) {
		t.Fatal("a batch with a retry-topic delivery takes the plain insert")
	}
	if in.usePlain(append(first, retrytopic.Metadata{Parked: true, Stage: -1})) {
		t.Fatal("a batch with a parked record takes the plain insert")
	}
	in.conflicted()
	if in.usePlain(first) {
		t.Fatal("a batch takes the plain insert right after one met a duplicate")
	}
	in.checkedUntil.Store(0)
	if !in.usePlain(first) {
		t.Fatal("the checked insert outlasts its window")
	}
	if in.conflicts.Load() != 1 {
		t.Fatalf("conflicts = %d, want 1", in.conflicts.Load())
	}
}
