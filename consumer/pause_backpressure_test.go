package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// gatedTopics is a handler whose calls for a topic wait until that topic's
// gate is opened (or the call's context ends), and which counts the
// records of each topic it handled.
type gatedTopics struct {
	mu      sync.Mutex
	gates   map[string]chan struct{}
	started map[string]int
	handled map[string]int
}

func newGatedTopics(topics ...string) *gatedTopics {
	g := &gatedTopics{gates: map[string]chan struct{}{}, started: map[string]int{}, handled: map[string]int{}}
	for _, t := range topics {
		g.gates[t] = make(chan struct{})
	}
	return g
}

func (g *gatedTopics) Handle(ctx context.Context, rec *consumer.Record) error {
	g.mu.Lock()
	g.started[rec.Topic]++
	gate := g.gates[rec.Topic]
	g.mu.Unlock()
	select {
	case <-gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	g.mu.Lock()
	g.handled[rec.Topic]++
	g.mu.Unlock()
	return nil
}

func (g *gatedTopics) open(topic string) { close(g.gates[topic]) }

func (g *gatedTopics) counts(topic string) (started, handled int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.started[topic], g.handled[topic]
}

func produceN(t *testing.T, k *testenv.Kafka, topic, prefix string, n int) {
	t.Helper()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%5), Value: fmt.Appendf(nil, "%s%d", prefix, i)}
	}
	if err := k.Produce(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
}

// clientPauses reports whether r's client holds topic's partition 0 out of
// its fetches.
func clientPauses(r *consumer.Runner, topic string) bool {
	cl := r.Client()
	return cl != nil && slices.Contains(cl.PauseFetchPartitions(nil)[topic], 0)
}

// A partition paused by the service (Runner.Pause) is not fetching: when
// another partition holds the whole in-flight bound, backpressure does not
// pause that one too, which would leave nothing fetching (and drop what
// the client buffered for the partition the service left running). Its
// records all get handled, with no backpressure pause at all.
func TestBackpressureSparesThePartitionAPauseLeftFetching(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const hog, held = "bpu-hog", "bpu-held"
	for _, topic := range []string{hog, held} {
		if err := k.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
	}
	g := newGatedTopics(hog, held)
	t.Cleanup(func() { g.open(held) })
	cfg := baseConfig(t, k, "g-bpu", hog, held)
	cfg.MaxInFlightRecords = 20
	cfg.MaxInFlightBytes = 1 << 30
	r, err := consumer.New(cfg, g)
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	produceN(t, k, held, "held-", 2)
	testenv.WaitFor(t, time.Minute, "the held topic's records polled", func() bool { return r.Stats().InFlight == 2 })
	if err := r.Pause(consumer.Topic(held), consumer.PauseReason("dependency down")); err != nil {
		t.Fatal(err)
	}

	// The hog takes the rest of the bound and holds it; the held topic's
	// two records stay in flight, paused.
	const n = 100
	produceN(t, k, hog, "hog-", n)
	testenv.WaitFor(t, time.Minute, "the bound reached", func() bool { return r.Stats().InFlight == int64(cfg.MaxInFlightRecords) })
	// The runner decides a backpressure pause once the bound has held for
	// two of its 100ms looks: watch ten of them.
	watch, look := time.After(time.Second), time.NewTicker(10*time.Millisecond)
	defer look.Stop()
	for watching := true; watching; {
		select {
		case <-watch:
			watching = false
		case <-look.C:
		}
		if st := r.Stats(); st.Pauses != 0 || clientPauses(r, hog) {
			t.Fatalf("backpressure paused the one partition the service left fetching (Stats.Pauses %d)", st.Pauses)
		}
	}
	g.open(hog)
	testenv.WaitFor(t, time.Minute, "every record of the hog handled", func() bool {
		_, h := g.counts(hog)
		return h == n
	})
	if st := r.Stats(); st.Pauses != 0 {
		t.Fatalf("Stats.Pauses %d; want no backpressure pause", st.Pauses)
	}
	if started, _ := g.counts(held); started > 2 {
		t.Fatalf("%d records of the paused topic started; want only the 2 polled before the pause", started)
	}
}

// A partition paused both for backpressure and by the service stays
// paused when its in-flight records drain: the backpressure's resume does
// not end the service's pause. Only Resume does.
func TestBackpressureResumeKeepsTheUserPause(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const busy, other = "bpr-busy", "bpr-other"
	for _, topic := range []string{busy, other} {
		if err := k.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
	}
	g := newGatedTopics(busy, other)
	cfg := baseConfig(t, k, "g-bpr", busy, other)
	cfg.MaxInFlightRecords = 20
	cfg.MaxInFlightBytes = 1 << 30
	r, err := consumer.New(cfg, g)
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	produceN(t, k, other, "other-", 1)
	testenv.WaitFor(t, time.Minute, "the other topic's record started", func() bool {
		s, _ := g.counts(other)
		return s == 1
	})
	const n = 40
	produceN(t, k, busy, "busy-", n)
	testenv.WaitFor(t, time.Minute, "the bound reached", func() bool { return r.Stats().InFlight == int64(cfg.MaxInFlightRecords) })
	if err := r.Pause(consumer.Topic(busy), consumer.PauseReason("maintenance")); err != nil {
		t.Fatal(err)
	}
	// The busy partition holds 19 of the 20 records in flight: the
	// backpressure pauses it as well.
	testenv.WaitFor(t, time.Minute, "the busy partition paused for backpressure", func() bool {
		st := r.Stats()
		return st.Pauses == 1 && st.PausedPartitions == 1
	})
	produceN(t, k, busy, "late-", 5)

	// Its records drain: the backpressure lets go of it, the pause does not.
	g.open(busy)
	g.open(other)
	testenv.WaitFor(t, time.Minute, "the backpressure pause ended", func() bool {
		return r.Stats().PausedPartitions == 0 && r.Stats().InFlight == 0
	})
	if !clientPauses(r, busy) {
		t.Fatal("the backpressure's resume resumed fetching of a partition the service paused")
	}
	produceN(t, k, other, "other-after-", 1)
	testenv.WaitFor(t, time.Minute, "the other topic flowing", func() bool {
		_, h := g.counts(other)
		return h == 2
	})
	polled := cfg.MaxInFlightRecords - 1
	if _, h := g.counts(busy); h != polled || !clientPauses(r, busy) {
		t.Fatalf("%d records of the paused topic handled before its resume; want the %d polled before the pause", h, polled)
	}
	if err := r.Resume(consumer.Topic(busy)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "every record of the resumed topic handled", func() bool {
		_, h := g.counts(busy)
		return h == n+5
	})
}
