package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// lagSeries keeps what a metrics hook would export for the partitions a
// LagHook reports: a series per partition from its first OnLag until its
// OnPartitionGone. Armed, its next OnLag waits until the partition it is
// told of is gone, to hold a lag report across a revoke.
type lagSeries struct {
	mu      sync.Mutex
	live    map[int32]bool
	reports int
	armed   bool
	holding chan struct{} // closed when an armed report waits
	gone    chan int32    // partitions gone, in order
}

func newLagSeries() *lagSeries {
	return &lagSeries{live: map[int32]bool{}, holding: make(chan struct{}), gone: make(chan int32, 16)}
}

func (s *lagSeries) OnLag(l hook.Lag) {
	s.mu.Lock()
	hold := s.armed
	s.armed = false
	s.mu.Unlock()
	if hold {
		close(s.holding)
		p := <-s.gone // a revoke ended an assignment while this report was under way
		s.gone <- p
	}
	s.mu.Lock()
	s.live[l.Partition] = true
	s.reports++
	s.mu.Unlock()
}

func (s *lagSeries) OnPartitionGone(_, _ string, p int32) {
	s.mu.Lock()
	delete(s.live, p)
	s.mu.Unlock()
	s.gone <- p
}

func (s *lagSeries) arm() {
	s.mu.Lock()
	s.armed = true
	s.mu.Unlock()
}

func (s *lagSeries) state() (live map[int32]bool, reports int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	live = make(map[int32]bool, len(s.live))
	for p := range s.live {
		live[p] = true
	}
	return live, s.reports
}

// A partition revoked while the lag of the assigned partitions is being
// reported is not reported after it was reported gone: a metrics hook
// would keep its series, at its last value, on a member that no longer
// owns it (a false lag alert, and two members reporting one partition).
func TestRevokeDuringLagReportLeavesNoSeries(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic, group = "lag-revoke", "g-lag-revoke"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	k.ProduceKeyed(t, topic, 20, 1) // keys over both partitions
	nop := consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil })
	lag := newLagSeries()
	cfg := baseConfig(t, k, group, topic)
	cfg.Hooks = []hook.Hook{lag}
	a, err := consumer.New(cfg, nop)
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, a)
	testenv.WaitFor(t, time.Minute, "both partitions' lag reported", func() bool {
		live, _ := lag.state()
		return len(live) == 2
	})
	lag.arm()
	<-lag.holding
	// A second member joins: one partition is revoked from the first
	// while its lag report waits.
	b, err := consumer.New(baseConfig(t, k, group, topic), nop)
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, b)
	testenv.WaitFor(t, time.Minute, "a partition revoked from the first member", func() bool { return a.Stats().Assigned == 1 })
	// Once the report that waited and a later one ran, the first member
	// reports only the partition it kept.
	_, before := lag.state()
	testenv.WaitFor(t, time.Minute, "a later lag report", func() bool {
		_, n := lag.state()
		return n >= before+3
	})
	live, _ := lag.state()
	if len(live) != 1 {
		t.Fatalf("the first member reports the lag of partitions %v after one was revoked; want only the one it kept", live)
	}
}

// lastLag keeps the last lag reported for each topic.
type lastLag struct {
	mu   sync.Mutex
	last map[string]hook.Lag
}

func (l *lastLag) OnLag(x hook.Lag) {
	l.mu.Lock()
	l.last[x.Topic] = x
	l.mu.Unlock()
}

func (l *lastLag) OnPartitionGone(string, string, int32) {}

func (l *lastLag) of(topic string) (hook.Lag, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	x, ok := l.last[topic]
	return x, ok
}

// A retry-topic record held until its due time is not lag: its partition's
// lag in seconds counts from its due time, not from when it was written
// (a record written 9 minutes ago to a retry topic, due in 30, read over
// 500 seconds, and paged "more than 5 minutes behind" on every record that
// climbs a 10-minute rung of the ladder).
func TestHeldRetryRecordIsNotLag(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const src, delay = "src-laghold", "g-laghold.kscope-retry-1h"
	for _, topic := range []string{src, delay} {
		if err := k.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	if err := k.Produce(ctx, &kgo.Record{Topic: delay, Value: []byte("waits"), Timestamp: now.Add(-9 * time.Minute), Headers: dueHeader(now.Add(30 * time.Minute))}); err != nil {
		t.Fatal(err)
	}
	s := &delayScope{topic: delay, maxDelay: time.Hour, handled: map[string]time.Time{}}
	lag := &lastLag{last: map[string]hook.Lag{}}
	cfg := baseConfig(t, k, "g-laghold", src)
	cfg.Hooks = []hook.Hook{lag}
	r, err := consumer.NewScoped(cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the held record's lag reported", func() bool {
		l, ok := lag.of(delay)
		return ok && l.InFlight == 1
	})
	l, _ := lag.of(delay)
	if l.Age > time.Minute || l.Offsets != 1 {
		t.Fatalf("a retry-topic record not due for 30 minutes reads %d records and %s of lag; want 1 and about 0s", l.Offsets, l.Age)
	}
	if s.count() != 0 {
		t.Fatal("the record was handled before its due time")
	}
}
