package dedupetest_test

import (
	"testing"

	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/dedupe/dedupetest"
)

// A test of a store of one's own: each subtest gets a fresh store.
func ExampleRun() {
	_ = func(t *testing.T) { // func TestMyStore(t *testing.T)
		dedupetest.Run(t, func(t *testing.T) dedupe.Store {
			return dedupe.NewMemory(1000) // your store, fresh and empty
		})
	}
}
