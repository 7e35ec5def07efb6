// Package checkkit holds what the checks every scope runs
// (internal/breakercheck, internal/keybreakercheck) share: running a
// runner for a test's length, and counting what reached the group's retry
// and dead-letter topics.
package checkkit

import (
	"context"
	"strings"
	"testing"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Run runs r until the test ends, and fails the test if Run returns an
// error.
func Run(t *testing.T, r *consumer.Runner) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// Routed returns how many records the group's retry and dead-letter
// topics hold.
func Routed(t *testing.T, k *testenv.Kafka, group string) int64 {
	topics, err := k.Admin().ListTopics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for name := range topics {
		if !strings.HasPrefix(name, retrytopic.SafeName(group)+".kscope-retry-") && name != retrytopic.DLTopic(group) {
			continue
		}
		ends, err := k.EndOffsets(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range ends {
			n += o
		}
	}
	return n
}
