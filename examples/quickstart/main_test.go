package main

import (
	"context"
	"testing"
)

// The example runs end to end: every record handled, every offset
// committed, its topic and group removed.
func TestQuickstartExample(t *testing.T) {
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
}
