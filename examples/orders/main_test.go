package main

import (
	"context"
	"log/slog"
	"testing"
)

// The example service handles every order and event exactly once, with
// the poison orders and the unrouted events in the dead-letter topics.
func TestOrdersService(t *testing.T) {
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
