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
