package main

import (
	"net"
	"os"
	"testing"

	"github.com/kscope-dev/kscope/kscopetest"
)

func TestMain(m *testing.M) {
	// The demo starts its consumer by running this binary again.
	if os.Getenv(roleEnv) != "" {
		os.Exit(runConsumer())
	}
	kscopetest.Main(m) // stops the kit's PostgreSQL server when the tests end
}

// The demo's invariants hold end to end: every payment booked exactly
// once through a crash and a replay, poison dead-lettered, gaps healed;
// and the ledger consumer, given -probes, serves /livez and /readyz,
// which answer 200 over HTTP once it caught up after its restart.
func TestDemo(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	probesAddr = l.Addr().String() // a free port for the consumer child
	l.Close()
	t.Cleanup(func() { probesAddr = "" })
	code, err := run()
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("the demo failed (exit %d); its report is above", code)
	}
}

// The dead-letter checks of the demo's outcome: a kill can double one dead
// letter per key-shard that was between the DLT's acknowledgement and its
// inbox row, so several doubles pass; a replay that dead-letters again, a
// poison record missing from the DLT, or more doubles than key-shards fail.
func TestInvariantsOnDeadLetters(t *testing.T) {
	s := stream{valid: map[string]bool{"a": true}, poison: 3}
	good := report{Effects: 1, GatewayCharges: 1, OutboxPublished: 1, Notifications: 1,
		ReplayNoopRate: 1, DeadLettered: 3, DLTRecords: 3}
	for _, c := range []struct {
		name string
		edit func(*report)
		want bool
	}{
		{"every poison record once", func(*report) {}, true},
		{"two doubled by the kill", func(r *report) { r.DLTRecords = 5 }, true},
		{"one per key-shard doubled", func(r *report) { r.DLTRecords = 3 + ledgerShards }, true},
		{"more doubles than key-shards", func(r *report) { r.DLTRecords = 3 + ledgerShards + 1 }, false},
		{"added by the replay", func(r *report) { r.DLTRecords, r.DLTAddedByReplay = 4, 1 }, false},
		{"a poison record missing", func(r *report) { r.DeadLettered, r.DLTRecords = 2, 2 }, false},
	} {
		rep := good
		c.edit(&rep)
		if got := invariantsHold(rep, s); got != c.want {
			t.Errorf("%s: invariantsHold = %v; want %v (%+v)", c.name, got, c.want, rep)
		}
	}
}
