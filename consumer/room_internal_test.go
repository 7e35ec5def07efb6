package consumer

import "testing"

// TestRoomToPollAndWakeUps: the poll loop polls only while half the bound
// is free (so that a poll takes the client's buffered response whole), and
// a worker wakes a waiting poll loop only once that much room is free, not
// at every finished batch.
func TestRoomToPollAndWakeUps(t *testing.T) {
	r := &Runner{cfg: Config{MaxInFlightRecords: 100, MaxInFlightBytes: 1 << 30}, room: make(chan struct{}, 1)}
	r.avgSize.Store(10)
	r.inflight.Store(100)
	r.inflightBytes.Store(1000)
	woken := func() bool {
		select {
		case <-r.room:
			return true
		default:
			return false
		}
	}

	if r.roomToPoll() {
		t.Fatal("at the bound the poll loop may poll")
	}
	r.waiting.Store(true)
	r.releaseN(20, 200) // 80 in flight
	if r.roomToPoll() || woken() {
		t.Fatal("with a fifth of the bound free the poll loop was woken or may poll")
	}
	r.releaseN(29, 290) // 51 in flight
	if r.roomToPoll() || woken() {
		t.Fatal("with less than half the bound free the poll loop was woken or may poll")
	}
	r.releaseN(1, 10) // 50 in flight
	if !r.roomToPoll() || !woken() {
		t.Fatal("with half the bound free the waiting poll loop was not woken")
	}
	if room, _ := r.roomNow(); room != 50 {
		t.Fatalf("a poll may take %d records with 50 of 100 in flight, want 50", room)
	}

	// The byte bound counts the same way, at the average record size.
	r.waiting.Store(false)
	r.cfg.MaxInFlightBytes = 400 // 40 records at 10 bytes
	r.inflight.Store(25)
	r.inflightBytes.Store(250)
	if r.roomToPoll() {
		t.Fatal("with 150 of 400 bytes free the poll loop may poll")
	}
	r.inflightBytes.Store(200)
	if !r.roomToPoll() {
		t.Fatal("with half the byte bound free the poll loop may not poll")
	}
}
