package main

import (
	"context"
	"strings"
	"testing"

	"github.com/kscope-dev/kscope/internal/exampleprobes/probetest"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// The example runs end to end: every record handled, every offset
// committed, its topic and group removed.
func TestQuickstartExample(t *testing.T) {
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Run as a service (-topic), the example serves /livez and /readyz on
// KSCOPE_PROBES_ADDR; both answer 200 over HTTP once the member joined
// and a cancel stops it cleanly.
func TestQuickstartServesProbes(t *testing.T) {
	k := testenv.KafkaT(t)
	if err := k.CreateTopic(context.Background(), "quickstart.probes", 2); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KAFKA_BROKERS", strings.Join(k.Brokers, ","))
	urls := probetest.Served(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serve(ctx, "quickstart.probes", "quickstart-probes") }()
	select {
	case base := <-urls:
		probetest.Ready(t, base, "quickstart-probes")
	case err := <-done:
		t.Fatalf("serve returned %v before it served the probes", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
