package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// shareKafka is a Kafka for share-group tests: on kfake, members heartbeat
// every 100ms (a member joins within one), and expired locks are found
// within 100ms (Apache Kafka's test brokers are set up alike).
func shareKafka(t *testing.T, lock time.Duration) *testenv.Kafka {
	return testenv.KafkaT(t, kfake.BrokerConfigs(map[string]string{
		"group.share.heartbeat.interval.ms":   "100",
		"share.record.lock.sweep.interval.ms": "100",
		// kfake's locks last as long as the broker says; Apache Kafka's
		// as the group says (ShareConfig.LockDuration).
		"group.share.record.lock.duration.ms": strconv.FormatInt(lock.Milliseconds(), 10),
	}))
}

// shareConfig is baseConfig as a member of share group group.
func shareConfig(t *testing.T, k *testenv.Kafka, group string, sc consumer.ShareConfig, topics ...string) consumer.Config {
	cfg := baseConfig(t, k, group, topics...)
	cfg.Share = &sc
	return cfg
}

// deliveries counts each value's handler calls.
type deliveries struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *deliveries) add(v string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[v]++
	return d.n[v]
}

func (d *deliveries) distinct() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.n)
}

func (d *deliveries) twice() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for v, n := range d.n {
		if n > 1 {
			out = append(out, v)
		}
	}
	return out
}

// Three members of one share group take the records of two partitions
// together (more members than partitions, which a consumer group cannot
// use): every record is handled once and accepted, and a member that
// joins afterwards gets only what was written since.
func TestShareGroupMembersShareTwoPartitions(t *testing.T) {
	k := shareKafka(t, 30*time.Second)
	ctx := context.Background()
	const topic, group, total = "work", "g-share", 600
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	k.ProduceKeyed(t, topic, 60, total/60)
	var seen deliveries
	var perMember [3]atomic.Int64
	var runners []*consumer.Runner
	var stops []func() error
	for i := range 3 {
		cfg := shareConfig(t, k, group, consumer.ShareConfig{}, topic)
		cfg.MaxInFlightRecords = 50 // small polls: every member gets some
		r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
			seen.add(string(rec.Value))
			perMember[i].Add(1)
			time.Sleep(time.Millisecond) // work that takes time, so that the records spread
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		runners = append(runners, r)
		stops = append(stops, runAsync(t, r))
	}
	testenv.WaitFor(t, time.Minute, "every record handled", func() bool { return seen.distinct() >= total })
	var accepted int64
	for i, r := range runners {
		testenv.WaitFor(t, 30*time.Second, "the member's records accepted", func() bool { st := r.Stats(); return st.InFlight == 0 })
		if err := stops[i](); err != nil {
			t.Fatal(err)
		}
		accepted += r.Stats().Share.Accepted
	}
	if d := seen.twice(); len(d) != 0 {
		t.Fatalf("%d records handled twice without a failure, e.g. %s", len(d), d[0])
	}
	busy := 0
	for i := range perMember {
		if perMember[i].Load() > 0 {
			busy++
		}
	}
	if busy < 2 {
		t.Fatalf("only %d of 3 members handled records: %d/%d/%d", busy, perMember[0].Load(), perMember[1].Load(), perMember[2].Load())
	}
	if accepted != total {
		t.Fatalf("%d records accepted, want %d", accepted, total)
	}

	// Everything was accepted: a new member's first record is one written
	// after the others.
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	first := make(chan string, 1)
	r, err := consumer.New(shareConfig(t, k, group, consumer.ShareConfig{}, topic), consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		select {
		case first <- string(rec.Value):
		default:
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	select {
	case v := <-first:
		if v != "after" {
			t.Fatalf("a new member's first record is %q: a record accepted before came again", v)
		}
	case <-time.After(time.Minute):
		t.Fatal("the record written after the others never came")
	}
}

// A record whose handler is still running when its member stops is
// released, not accepted: another member handles it at once, as its
// second delivery. Past Share.MaxDeliveries a delivery goes to the
// dead-letter topic without its handler, with its delivery count.
func TestShareGroupReleasesUnfinishedAndDeadLettersPastMaxDeliveries(t *testing.T) {
	k := shareKafka(t, 30*time.Second)
	ctx := context.Background()
	const topic, group = "jobs", "g-share-release"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("stuck")}); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	var once sync.Once
	cfg := shareConfig(t, k, group, consumer.ShareConfig{}, topic)
	cfg.DrainTimeout = 200 * time.Millisecond
	a, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		once.Do(func() { close(started) })
		<-ctx.Done() // runs until the member stops
		return ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	stopA := runAsync(t, a)
	<-started
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats().Share; st.Released != 1 || st.Accepted != 0 {
		t.Fatalf("the stopped member released %d and accepted %d records, want 1 and 0", st.Released, st.Accepted)
	}

	// The second delivery: handled, and counted as a redelivery.
	got := make(chan int32, 1)
	b, err := consumer.New(shareConfig(t, k, group, consumer.ShareConfig{MaxDeliveries: 2}, topic), consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		got <- rec.DeliveryCount()
		<-ctx.Done()
		return ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	stopB := runAsync(t, b)
	select {
	case n := <-got:
		if n != 2 {
			t.Fatalf("delivery count %d, want 2", n)
		}
	case <-time.After(time.Minute):
		t.Fatal("the released record never came to the next member")
	}
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats().Share; st.Redelivered != 1 {
		t.Fatalf("Redelivered %d, want 1", st.Redelivered)
	}

	// The third delivery is past MaxDeliveries 2: dead-lettered unhandled.
	var calls atomic.Int64
	c, err := consumer.New(shareConfig(t, k, group, consumer.ShareConfig{MaxDeliveries: 2}, topic), consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		calls.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, c)
	dlt := retrytopic.DLTopic(group)
	testenv.WaitFor(t, time.Minute, "the record dead-lettered", func() bool { return c.Stats().Share.Accepted == 1 })
	if n := calls.Load(); n != 0 {
		t.Fatalf("the handler ran %d times past MaxDeliveries", n)
	}
	recs := k.ReadAll(t, dlt)
	if len(recs) != 1 {
		t.Fatalf("%d dead letters, want 1", len(recs))
	}
	if n := testenv.Header(recs[0], retrytopic.HeaderDeliveryCount); n != "3" {
		t.Fatalf("the dead letter's %s is %q, want 3", retrytopic.HeaderDeliveryCount, n)
	}
	if e := testenv.Header(recs[0], retrytopic.HeaderError); !strings.Contains(e, "Share.MaxDeliveries") {
		t.Fatalf("the dead letter's error %q does not say why", e)
	}
	if st := c.Stats().Share; st.Exhausted != 1 {
		t.Fatalf("Exhausted %d, want 1", st.Exhausted)
	}
}

// A handler that outlives its record's acquisition lock keeps the record:
// the runner renews the lock, the broker gives it to no other member, and
// it is handled once. Without renewal (the control) the lock expires, the
// other member, idle and polling, takes the record, and it is handled
// twice.
func TestShareGroupRenewsLocksOfLongHandlers(t *testing.T) {
	for _, renew := range []bool{true, false} {
		t.Run(fmt.Sprintf("renew=%v", renew), func(t *testing.T) {
			const lock = 1500 * time.Millisecond
			k := shareKafka(t, lock)
			ctx := context.Background()
			const topic, group = "slow", "g-share-renew"
			if err := k.CreateTopic(ctx, topic, 1); err != nil {
				t.Fatal(err)
			}
			sc := consumer.ShareConfig{RenewBefore: time.Second, LockDuration: lock}
			if !renew {
				sc.RenewBefore = -1
			}
			var seen deliveries
			var runners []*consumer.Runner
			for range 2 {
				r, err := consumer.New(shareConfig(t, k, group, sc, topic), consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
					if seen.add(string(rec.Value)) == 1 {
						// Work that takes twice the lock's length.
						select {
						case <-time.After(2 * lock):
						case <-ctx.Done():
							return ctx.Err()
						}
					}
					return nil
				}))
				if err != nil {
					t.Fatal(err)
				}
				runners = append(runners, r)
				runAsync(t, r)
			}
			if err := k.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte("long")}); err != nil {
				t.Fatal(err)
			}
			var accepted, renewals, redelivered, lost int64
			testenv.WaitFor(t, time.Minute, "the record finished", func() bool {
				accepted, renewals, redelivered, lost = 0, 0, 0, 0
				for _, r := range runners {
					st := r.Stats().Share
					accepted += st.Accepted
					renewals += st.Renewals
					redelivered += st.Redelivered
					lost += st.LocksLost
				}
				// Without renewals, the first delivery finishes after its
				// lock expired (LocksLost), the second is accepted.
				return accepted >= 1 && (renew || redelivered >= 1 && lost >= 1)
			})
			twice := seen.twice()
			if renew && (len(twice) != 0 || renewals == 0 || redelivered != 0 || lost != 0) {
				t.Fatalf("with renewals: handled twice %v, %d renewals, %d redelivered; want none twice, renewals, none redelivered", twice, renewals, redelivered)
			}
			if !renew && len(twice) != 1 {
				t.Fatalf("without renewals: handled twice %v; the control should see the expired record again", twice)
			}
		})
	}
}

// What a share group cannot do is refused at construction, with the
// field to change.
func TestShareGroupRefusals(t *testing.T) {
	base := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}, Share: &consumer.ShareConfig{}}
	h := consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil })
	for name, mod := range map[string]func(*consumer.Config){
		"KeyBreaker":         func(c *consumer.Config) { c.KeyBreaker = &consumer.KeyBreakerConfig{} },
		"Failures.Unordered": func(c *consumer.Config) { c.Failures.Unordered = true },
		"Idle": func(c *consumer.Config) {
			c.Idle = consumer.IdleConfig{After: time.Second, Member: func(context.Context, time.Time) {}}
		},
		"Periodic": func(c *consumer.Config) {
			c.Periodic = consumer.PeriodicConfig{Interval: time.Second, Func: func(context.Context, string, int32) error { return nil }}
		},
		"TopicPatterns":       func(c *consumer.Config) { c.Topics, c.TopicPatterns = nil, []string{"t.*"} },
		"Share.MaxDeliveries": func(c *consumer.Config) { c.Share = &consumer.ShareConfig{MaxDeliveries: -1} },
		"Share.StartFrom":     func(c *consumer.Config) { c.Share = &consumer.ShareConfig{StartFrom: 7} },
		"Share.LockDuration":  func(c *consumer.Config) { c.Share = &consumer.ShareConfig{LockDuration: -time.Second} },
	} {
		cfg := base
		mod(&cfg)
		_, err := consumer.New(cfg, h)
		var ce *consumer.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: got %v, want a ConfigError naming it", name, err)
		}
	}
	if cfg := base.WithDefaults(); !cfg.Failures.DisableRetryTopics || cfg.Share.MaxDeliveries != consumer.DefaultShareMaxDeliveries {
		t.Fatalf("a share group's defaults: DisableRetryTopics %v, MaxDeliveries %d", cfg.Failures.DisableRetryTopics, cfg.Share.MaxDeliveries)
	}
}

// A topic a share-group member pauses, before it runs or while it runs,
// is not fetched while its other topic flows, and its records are handled
// once it resumes.
func TestShareGroupPauseTopic(t *testing.T) {
	k := shareKafka(t, 30*time.Second)
	ctx := context.Background()
	const paused, flowing, group = "sp-paused", "sp-flowing", "g-share-pause"
	for _, topic := range []string{paused, flowing} {
		if err := k.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
	}
	var seen deliveries
	r, err := consumer.New(shareConfig(t, k, group, consumer.ShareConfig{}, paused, flowing), consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		seen.add(string(rec.Value))
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	has := func(v string) bool {
		seen.mu.Lock()
		defer seen.mu.Unlock()
		return seen.n[v] > 0
	}
	produce := func(topic, v string) {
		t.Helper()
		if err := k.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(round string) {
		t.Helper()
		produce(paused, "held-"+round)
		produce(flowing, "flows-"+round)
		testenv.WaitFor(t, time.Minute, "the flowing topic's record handled", func() bool { return has("flows-" + round) })
		if has("held-" + round) {
			t.Fatalf("%s: a record of the paused topic was handled while it was paused", round)
		}
		if err := r.Resume(consumer.Topic(paused)); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, time.Minute, "the paused topic's record handled after the resume", func() bool { return has("held-" + round) })
	}
	if err := r.Pause(consumer.Topic(paused)); err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	check("before-run")
	if err := r.Pause(consumer.Topic(paused)); err != nil {
		t.Fatal(err)
	}
	check("while-running")
}

// A batch handler runs in a share group as in a consumer group: each
// record of a batch that succeeded is accepted, once.
func TestShareGroupBatchHandler(t *testing.T) {
	k := shareKafka(t, 30*time.Second)
	ctx := context.Background()
	const topic, group, total = "batched", "g-share-batch", 300
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	k.ProduceKeyed(t, topic, 30, total/30)
	var seen deliveries
	r, err := consumer.NewBatch(shareConfig(t, k, group, consumer.ShareConfig{KeyOrder: true}, topic), consumer.BatchHandlerFunc(func(ctx context.Context, recs []*consumer.Record) error {
		for _, rec := range recs {
			seen.add(string(rec.Value))
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record accepted", func() bool { return r.Stats().Share.Accepted >= total })
	if seen.distinct() != total || len(seen.twice()) != 0 {
		t.Fatalf("%d records handled, %d twice; want %d once each", seen.distinct(), len(seen.twice()), total)
	}
}
