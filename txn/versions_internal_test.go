package txn

import "testing"

// Partitions can be assigned before the runner hands the scope its way to
// wake the poll loop: the store wakes it as soon as it can, so that their
// versions are restored and their parked records time out even when no
// record arrives.
func TestVersionStoreWakesForEarlierAssignments(t *testing.T) {
	s := &versionStore{parts: map[tp]*partVersions{}, owned: map[tp]uint64{}, expiringSet: map[*parkedRec]bool{}}
	s.assigned(map[string][]int32{"in": {0, 2}})
	woken := 0
	s.setKick(func() { woken++ })
	if woken != 1 {
		t.Fatalf("woken %d times for partitions assigned before the kick was set, want 1", woken)
	}
	if got := len(s.missing([]string{"in"})); got != 2 {
		t.Fatalf("%d partitions to restore, want 2", got)
	}

	empty := &versionStore{parts: map[tp]*partVersions{}, owned: map[tp]uint64{}}
	empty.setKick(func() { woken++ })
	if woken != 1 {
		t.Fatal("woken with nothing assigned")
	}
}
