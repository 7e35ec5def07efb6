package consumer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// idleCalls records Config.Idle's calls.
type idleCalls struct {
	mu     sync.Mutex
	parts  map[int32][]time.Time // the since of each call, per partition
	member []time.Time
}

func (c *idleCalls) partition(_ context.Context, _ string, p int32, since time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.parts[p] = append(c.parts[p], since)
}

func (c *idleCalls) memberIdle(_ context.Context, since time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.member = append(c.member, since)
}

func (c *idleCalls) counts() (parts map[int32]int, member int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	parts = make(map[int32]int)
	for p, s := range c.parts {
		parts[p] = len(s)
	}
	return parts, len(c.member)
}

func (c *idleCalls) lastSince(p int32) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.parts[p]
	return s[len(s)-1]
}

// A partition with no record for Idle.After gets one Idle.Partition call,
// and the member, once every partition is idle, one Idle.Member call; not
// again while they stay idle, and again once records flowed and they went
// idle anew.
func TestIdleOncePerIdlePeriod(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic, after = "idle", 300 * time.Millisecond
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	calls := &idleCalls{parts: make(map[int32][]time.Time)}
	cfg := baseConfig(t, k, "g-idle", topic)
	cfg.Idle = consumer.IdleConfig{After: after, Partition: calls.partition, Member: calls.memberIdle}
	var handled sync.WaitGroup
	handled.Add(3)
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		handled.Done()
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop := runAsync(t, r)
	testenv.WaitFor(t, 30*time.Second, "both partitions and the member called idle", func() bool {
		parts, member := calls.counts()
		return parts[0] >= 1 && parts[1] >= 1 && member >= 1
	})
	if d := time.Since(start); d < after {
		t.Fatalf("idle called %s after Run began, before After (%s)", d, after)
	}

	// Records flow on partition 0 alone: it goes idle anew once they are
	// handled, and so does the member; partition 1, idle all along, is
	// not called again meanwhile.
	cl, err := k.Client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produced := time.Now()
	for i := range 3 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte{byte(i)}}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	handled.Wait()
	testenv.WaitFor(t, 30*time.Second, "partition 0 and the member called idle again", func() bool {
		parts, member := calls.counts()
		return parts[0] >= 2 && member >= 2
	})
	if since := calls.lastSince(0); since.Before(produced) {
		t.Fatalf("partition 0's second idle period began at %s, before its records were produced (%s)", since, produced)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	parts, member := calls.counts()
	if parts[1] != 1 || parts[0] != 2 || member != 2 {
		t.Fatalf("idle calls: partitions %v, member %d; want partition 0 twice, partition 1 once, the member twice", parts, member)
	}
}

// An idle call's context ends when its partition is revoked or the runner
// stops, and Run returns only once the call returned.
func TestIdleCallEndsWithRunner(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic = "idle-stop"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	returned := false
	cfg := baseConfig(t, k, "g-idle-stop", topic)
	cfg.Idle = consumer.IdleConfig{After: 50 * time.Millisecond, Partition: func(ctx context.Context, _ string, _ int32, _ time.Time) {
		once.Do(func() { close(entered) })
		<-ctx.Done()
		mu.Lock()
		returned = true
		mu.Unlock()
	}}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("Idle.Partition not called within 30s")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !returned {
		t.Fatal("Run returned before the idle call did")
	}
}

// periodicCalls records the periodic calls of several members, per
// partition, and how many run at once for one partition.
type periodicCalls struct {
	mu      sync.Mutex
	calls   map[string]map[int32]int // member → partition → calls
	first   map[string]map[int32]time.Time
	last    map[string]map[int32]time.Time // when the member's last call for the partition began
	running map[int32]int
	members map[string]int // calls running, per member
	overlap int
	cut     int // calls whose context ended before their work did
}

func newPeriodicCalls() *periodicCalls {
	return &periodicCalls{calls: map[string]map[int32]int{}, first: map[string]map[int32]time.Time{},
		last: map[string]map[int32]time.Time{}, running: map[int32]int{}, members: map[string]int{}}
}

// fn returns member's Periodic.Func: each call takes a while, so that
// calls of two members for one partition at once would be seen.
func (c *periodicCalls) fn(member string) func(ctx context.Context, topic string, p int32) error {
	return func(ctx context.Context, _ string, p int32) error {
		now := time.Now()
		c.mu.Lock()
		if c.calls[member] == nil {
			c.calls[member], c.first[member], c.last[member] = map[int32]int{}, map[int32]time.Time{}, map[int32]time.Time{}
		}
		if c.calls[member][p] == 0 {
			c.first[member][p] = now
		}
		c.calls[member][p]++
		c.last[member][p] = now
		c.running[p]++
		c.members[member]++
		if c.running[p] > 1 {
			c.overlap++
		}
		c.mu.Unlock()
		defer func() {
			c.mu.Lock()
			c.running[p]--
			c.members[member]--
			c.mu.Unlock()
		}()
		select { // the work
		case <-time.After(60 * time.Millisecond):
		case <-ctx.Done():
			c.mu.Lock()
			c.cut++
			c.mu.Unlock()
		}
		return nil
	}
}

func (c *periodicCalls) count(member string, p int32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[member][p]
}

func (c *periodicCalls) firstLast(member string, p int32) (first, last time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.first[member][p], c.last[member][p]
}

func (c *periodicCalls) runningOf(member string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[member]
}

// Periodic runs every Interval for each partition while it is assigned to
// the member: when a second member takes a partition, its calls stop on
// the first before they start on the second (never two at once), and a
// runner's stop waits for its running calls.
func TestPeriodicFollowsAssignment(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic, group = "periodic", "g-periodic"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	calls := newPeriodicCalls()
	newMember := func(name string) *consumer.Runner {
		cfg := baseConfig(t, k, group, topic)
		cfg.Periodic = consumer.PeriodicConfig{Interval: 100 * time.Millisecond, Func: calls.fn(name)}
		r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := newMember("a")
	stopA := runAsync(t, a)
	testenv.WaitFor(t, 30*time.Second, "member a's periodic calls on both partitions", func() bool {
		return calls.count("a", 0) >= 3 && calls.count("a", 1) >= 3
	})

	b := newMember("b")
	stopB := runAsync(t, b)
	testenv.WaitFor(t, 60*time.Second, "member b's periodic calls on the partition it took", func() bool {
		return calls.count("b", 0) >= 3 || calls.count("b", 1) >= 3
	})
	moved := int32(0)
	if calls.count("b", 1) >= 3 {
		moved = 1
	}
	stayed := 1 - moved
	_, lastA := calls.firstLast("a", moved)
	firstB, _ := calls.firstLast("b", moved)
	if !lastA.Before(firstB) {
		t.Fatalf("member a called the periodic work of partition %d at %s, after member b began it at %s", moved, lastA, firstB)
	}
	// Member a goes on with the partition it kept.
	kept := calls.count("a", stayed)
	testenv.WaitFor(t, 30*time.Second, "member a's periodic calls on the partition it kept", func() bool {
		return calls.count("a", stayed) >= kept+3
	})
	if n := a.Stats().Periodic.Runs; n < 6 {
		t.Fatalf("Stats.Periodic.Runs = %d; want the calls counted", n)
	}

	// Member b stops: its calls end with it, and member a takes the
	// partition's calls back.
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	if n := calls.runningOf("b"); n != 0 {
		t.Fatalf("%d periodic calls of member b still running after its Run returned", n)
	}
	ofB := calls.count("b", moved)
	back := calls.count("a", moved)
	testenv.WaitFor(t, 60*time.Second, "member a's periodic calls on the partition it took back", func() bool {
		return calls.count("a", moved) >= back+3
	})
	if n := calls.count("b", moved); n != ofB {
		t.Fatalf("member b made %d periodic calls after its Run returned", n-ofB)
	}
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	if n := calls.runningOf("a"); n != 0 {
		t.Fatalf("%d periodic calls still running after Run returned", n)
	}
	calls.mu.Lock()
	defer calls.mu.Unlock()
	if calls.overlap != 0 {
		t.Fatalf("%d times two periodic calls ran at once for one partition", calls.overlap)
	}
	// The revokes and the stops waited for the running calls (well within
	// DrainTimeout) rather than cancel them.
	if calls.cut != 0 {
		t.Fatalf("%d periodic calls canceled by a revoke or a stop instead of waited for", calls.cut)
	}
}

// A periodic call that fails or panics is counted in Stats.Periodic.Errors
// and runs again at the next interval.
func TestPeriodicErrorRunsAgain(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic = "periodic-fail"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	n := 0
	cfg := baseConfig(t, k, "g-periodic-fail", topic)
	cfg.Periodic = consumer.PeriodicConfig{Interval: 50 * time.Millisecond, Func: func(context.Context, string, int32) error {
		mu.Lock()
		defer mu.Unlock()
		n++
		switch n {
		case 1:
			return errors.New("the store is down")
		case 2:
			panic("a bug")
		}
		return nil
	}}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, 30*time.Second, "a periodic call that succeeds after two failures", func() bool {
		return r.Stats().Periodic.Runs >= 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats().Periodic; st.Errors != 2 {
		t.Fatalf("Stats.Periodic = %+v; want the error and the panic counted", st)
	}
}

// Idle and Periodic that cannot work are refused at construction, with
// the field to change.
func TestIdleWorkConfigRefused(t *testing.T) {
	noop := func(context.Context, string, int32) error { return nil }
	for _, c := range []struct {
		name  string
		set   func(*consumer.Config)
		field string
	}{
		{"idle after negative", func(c *consumer.Config) {
			c.Idle = consumer.IdleConfig{After: -time.Second, Member: func(context.Context, time.Time) {}}
		}, "Config.Idle.After"},
		{"idle after with no function", func(c *consumer.Config) { c.Idle.After = time.Second }, "Config.Idle.After"},
		{"idle function with no after", func(c *consumer.Config) {
			c.Idle.Partition = func(context.Context, string, int32, time.Time) {}
		}, "Config.Idle.After"},
		{"periodic too often", func(c *consumer.Config) {
			c.Periodic = consumer.PeriodicConfig{Interval: time.Millisecond, Func: noop}
		}, "Config.Periodic.Interval"},
		{"periodic with no function", func(c *consumer.Config) { c.Periodic.Interval = time.Second }, "Config.Periodic.Func"},
		{"periodic function with no interval", func(c *consumer.Config) { c.Periodic.Func = noop }, "Config.Periodic.Interval"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}}
			c.set(&cfg)
			_, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
			var ce *consumer.ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.field+":") {
				t.Fatalf("New: %v; want a ConfigError on %s", err, c.field)
			}
		})
	}
}
