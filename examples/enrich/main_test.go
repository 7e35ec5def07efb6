package main

import (
	"testing"

	"github.com/kscope-dev/kscope/internal/exampleprobes/probetest"
)

// The example runs end to end: every order enriched once, read back with
// read_committed; with KSCOPE_PROBES_ADDR set it serves /livez and
// /readyz, and both answer 200 over HTTP while the pipeline runs.
func TestEnrichExample(t *testing.T) {
	probetest.Expect(t, group)
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
