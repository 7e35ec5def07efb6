package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/kscope-dev/kscope/internal/exampleprobes/probetest"
)

// The example service handles every order and event exactly once, with
// the poison orders and the unrouted events in the dead-letter topics;
// with KSCOPE_PROBES_ADDR set it serves /livez and /readyz of both
// consumers, and both answer 200 over HTTP while they run.
func TestOrdersService(t *testing.T) {
	probetest.Expect(t)
	rep, err := run(context.Background(), slog.New(slog.DiscardHandler), workload{orders: 200, customers: 20})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		t.Fatalf("report: %+v", rep)
	}
	if rep.OrdersDLT != 3 || rep.DecodeHeaders != 3 {
		t.Fatalf("poison orders in the DLT: %d with decode headers %d, want 3", rep.OrdersDLT, rep.DecodeHeaders)
	}
}
