package main

import "testing"

// The example runs end to end: every order enriched once, read back with
// read_committed.
func TestEnrichExample(t *testing.T) {
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
