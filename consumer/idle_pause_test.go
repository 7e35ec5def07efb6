package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// idleByTopic records Idle.Partition's calls per topic: when each came and
// the since it was given.
type idleByTopic struct {
	mu     sync.Mutex
	at     map[string][]time.Time
	since  map[string][]time.Time
	member int
}

func (c *idleByTopic) partition(_ context.Context, topic string, _ int32, since time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at[topic] = append(c.at[topic], time.Now())
	c.since[topic] = append(c.since[topic], since)
}

func (c *idleByTopic) memberIdle(context.Context, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.member++
}

func (c *idleByTopic) calls(topic string) (at, since []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.at[topic]...), append([]time.Time(nil), c.since[topic]...)
}

func (c *idleByTopic) memberCalls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.member
}

// A partition a pause holds gets no Idle.Partition call, however long the
// pause lasts: its quiet is the pause's. Its idle period starts when it
// resumes, and it is called After past the resume. Meanwhile it does not
// keep the member from being idle.
func TestIdleNotCalledForAPausedPartition(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const held, open, after = "idle-held", "idle-open", 200 * time.Millisecond
	for _, topic := range []string{held, open} {
		if err := k.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
	}
	calls := &idleByTopic{at: map[string][]time.Time{}, since: map[string][]time.Time{}}
	cfg := baseConfig(t, k, "g-idle-paused", held, open)
	cfg.Idle = consumer.IdleConfig{After: after, Partition: calls.partition, Member: calls.memberIdle}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Pause(consumer.Topic(held)); err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, 30*time.Second, "the open topic's partition and the member called idle", func() bool {
		at, _ := calls.calls(open)
		return len(at) >= 1 && calls.memberCalls() >= 1
	})
	openAt, _ := calls.calls(open)

	// Five more idle periods' worth of pause: no call for the held topic.
	watch, look := time.After(5*after), time.NewTicker(after/10)
	defer look.Stop()
	for watching := true; watching; {
		select {
		case <-watch:
			watching = false
		case <-look.C:
		}
		if at, _ := calls.calls(held); len(at) > 0 {
			t.Fatalf("Idle.Partition called for a paused partition, %s after the open one's call", at[0].Sub(openAt[0]))
		}
	}

	resumed := time.Now()
	if err := r.Resume(consumer.Topic(held)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the resumed partition called idle", func() bool {
		at, _ := calls.calls(held)
		return len(at) == 1
	})
	at, since := calls.calls(held)
	// The runner looks every tenth of After: a period is known to within
	// that much.
	if since[0].Before(resumed.Add(-after / 5)) {
		t.Fatalf("the resumed partition's idle period began %s before its resume; want it to begin at the resume", resumed.Sub(since[0]))
	}
	if d := at[0].Sub(resumed); d < after*8/10 {
		t.Fatalf("the resumed partition was called idle %s after its resume; want After (%s)", d, after)
	}
}
