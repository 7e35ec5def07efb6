package consumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// A share-group runner's probes: not ready before Run; ready (joined) once
// its client runs, with no partition assigned to wait for; live and ready
// while it waits in a poll and while it waits for a poll's records to be
// acknowledged (a handler that runs long is no stuck loop); not ready, and
// still live, once Run returned cleanly.
func TestShareGroupRunnerHealth(t *testing.T) {
	k := shareKafka(t, 30*time.Second)
	ctx := context.Background()
	const topic, group = "probes", "g-share-health"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}, 1), make(chan struct{})
	r, err := consumer.New(shareConfig(t, k, group, consumer.ShareConfig{}, topic), consumer.HandlerFunc(func(ctx context.Context, _ *consumer.Record) error {
		started <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if h := r.Health(); h.Ready || !h.Live || !strings.Contains(strings.Join(h.NotReady, "\n"), "Run has not been called") {
		t.Fatalf("before Run: %+v", h)
	}
	stop := runAsync(t, r)
	var h consumer.Health
	testenv.WaitFor(t, 30*time.Second, "the runner ready and waiting in a poll", func() bool {
		h = r.Health()
		return h.Ready && h.InPoll
	})
	if !h.Live || !h.Joined || !h.Running || h.PolledAt.IsZero() {
		t.Fatalf("a share-group runner waiting in a poll: %+v", h)
	}

	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	<-started
	testenv.WaitFor(t, 10*time.Second, "the runner waiting for the poll's acknowledgements", func() bool {
		h = r.Health()
		return h.InPoll && r.Stats().InFlight == 1
	})
	if !h.Live || !h.Ready {
		t.Fatalf("a share-group runner whose handler runs: live %v ready %v: %v", h.Live, h.Ready, h.NotReady)
	}
	close(release)
	testenv.WaitFor(t, 30*time.Second, "the record accepted", func() bool { return r.Stats().Share.Accepted == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if h := r.Health(); h.Ready || !h.Live || !strings.Contains(strings.Join(h.NotReady, "\n"), "Run returned") {
		t.Fatalf("after a clean stop: %+v", h)
	}
}
