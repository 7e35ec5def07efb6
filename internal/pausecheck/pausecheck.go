// Package pausecheck is the test of a pause (consumer.Runner.Pause) that
// every scope passes: a topic paused while records flow is not handled
// until it is resumed, other topics go on, and a rebalance keeps it
// paused. Each scope's tests run it with their own runner.
package pausecheck

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// The topics the check consumes: Paused is paused, Flowing goes on.
const (
	Paused  = "pc-paused"
	Flowing = "pc-flowing"
)

// NewRunner builds a member of cfg.Group in the scope under test from
// cfg, which names the topics, the brokers and a hook the check needs.
type NewRunner func(cfg consumer.Config) (*consumer.Runner, error)

// Config is the configuration the check passes to NewRunner.
func Config(k *testenv.Kafka, group string, h hook.Hook) consumer.Config {
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("KSCOPE_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{Paused, Flowing},
		Shards: 4, CommitInterval: 50 * time.Millisecond, DrainTimeout: 5 * time.Second,
		Logger: logger, Hooks: []hook.Hook{h},
	}
}

// starts is a hook that notes the records whose delivery started (their
// handler is about to run), by value, and those of the paused topic
// produced after the pause that started before the resume.
type starts struct {
	mu      sync.Mutex
	started map[string]bool
	resumed bool
	early   []string
}

func (s *starts) OnRecordStart(ctx context.Context, e hook.RecordStart) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := string(e.Record.Value)
	s.started[v] = true
	if strings.HasPrefix(v, "after-pause-") && !s.resumed {
		s.early = append(s.early, v)
	}
	return ctx
}

func (s *starts) OnRecordEnd(context.Context, hook.RecordEnd) {}

func (s *starts) all(prefix string, n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range n {
		if !s.started[fmt.Sprintf("%s%d", prefix, i)] {
			return false
		}
	}
	return true
}

func (s *starts) earlyOnes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.early...)
}

func produce(t *testing.T, k *testenv.Kafka, topic, prefix string, n int) {
	t.Helper()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%7), Value: fmt.Appendf(nil, "%s%d", prefix, i)}
	}
	if err := k.Produce(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
}

// clientPaused returns how many partitions of the paused topic r's
// client does not fetch.
func clientPaused(r *consumer.Runner) int {
	cl := r.Client()
	if cl == nil {
		return -1
	}
	return len(cl.PauseFetchPartitions(nil)[Paused])
}

func run(t *testing.T, r *consumer.Runner) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Run checks that a topic paused while its records flow is not fetched
// until resumed (the records polled before the pause finish), that the
// other topic goes on, and that a rebalance keeps the pause: a second
// member (paused before it runs) joins and leaves, and the partitions that
// come back to the first stay paused. Nothing is lost: after the resume
// every record is handled and the group's offsets reach the ends.
func Run(t *testing.T, k *testenv.Kafka, group string, newRunner NewRunner) {
	ctx := context.Background()
	if err := k.CreateTopic(ctx, Paused, 4); err != nil {
		t.Fatal(err)
	}
	if err := k.CreateTopic(ctx, Flowing, 1); err != nil {
		t.Fatal(err)
	}
	seen := &starts{started: map[string]bool{}}
	r1, err := newRunner(Config(k, group, seen))
	if err != nil {
		t.Fatal(err)
	}
	run(t, r1)
	produce(t, k, Flowing, "flowing-", 20)
	testenv.WaitFor(t, time.Minute, "the flowing topic handled", func() bool { return seen.all("flowing-", 20) })

	// Pause while the paused topic's records flow.
	produce(t, k, Paused, "before-pause-", 200)
	testenv.WaitFor(t, time.Minute, "the first records of the paused topic handled", func() bool { return seen.all("before-pause-", 1) })
	if err := r1.Pause(consumer.Topic(Paused)); err != nil {
		t.Fatal(err)
	}
	if ps := r1.Stats().Paused; len(ps) != 1 || ps[0].Target != consumer.Topic(Paused) || ps[0].Since.IsZero() || ps[0].Reason != "user" {
		t.Fatalf("Stats.Paused %+v; want the paused topic, since now, reason user", ps)
	}
	produce(t, k, Paused, "after-pause-", 50)
	produce(t, k, Flowing, "during-", 20)
	testenv.WaitFor(t, time.Minute, "the flowing topic handled during the pause", func() bool { return seen.all("during-", 20) })

	// A rebalance: a second member, paused too, joins and leaves; the
	// partitions that come back to the first stay paused.
	assigned := r1.Stats().Assigned
	r2, err := newRunner(Config(k, group, seen))
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.Pause(consumer.Topic(Paused)); err != nil {
		t.Fatal(err)
	}
	stop2 := run(t, r2)
	testenv.WaitFor(t, time.Minute, "the second member to take partitions", func() bool { return r1.Stats().Assigned < assigned && r2.Stats().Assigned > 0 })
	// Each member's client pauses the paused topic's partitions it owns,
	// and only those: the first lifted its pause of those it gave up.
	testenv.WaitFor(t, time.Minute, "the paused topic's partitions paused in their owners' clients", func() bool {
		return clientPaused(r1)+clientPaused(r2) == 4
	})
	produce(t, k, Flowing, "shared-", 20)
	testenv.WaitFor(t, time.Minute, "the flowing topic handled with two members", func() bool { return seen.all("shared-", 20) })
	stop2()
	testenv.WaitFor(t, time.Minute, "the partitions back with the first member", func() bool { return r1.Stats().Assigned == assigned })
	// The partitions that came back are paused before they are fetched.
	testenv.WaitFor(t, time.Minute, "every partition of the paused topic paused in the first member's client", func() bool {
		return clientPaused(r1) == 4
	})
	produce(t, k, Flowing, "back-", 20)
	testenv.WaitFor(t, time.Minute, "the flowing topic handled after the rebalance", func() bool { return seen.all("back-", 20) })
	if early := seen.earlyOnes(); len(early) > 0 {
		t.Fatalf("records of the paused topic produced after the pause were handled before the resume: %v", early)
	}

	if err := r1.Resume(consumer.Topic(Paused)); err != nil {
		t.Fatal(err)
	}
	seen.mu.Lock()
	seen.resumed = true
	seen.mu.Unlock()
	if ps := r1.Paused(); len(ps) != 0 {
		t.Fatalf("Paused() %+v after Resume; want none", ps)
	}
	testenv.WaitFor(t, time.Minute, "the paused topic handled after the resume", func() bool {
		return seen.all("after-pause-", 50) && seen.all("before-pause-", 200)
	})
	testenv.WaitFor(t, time.Minute, "the group caught up", func() bool {
		return k.CaughtUp(ctx, group, Paused) && k.CaughtUp(ctx, group, Flowing)
	})
}
