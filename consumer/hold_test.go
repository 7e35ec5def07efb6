package consumer_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// delayScope handles records at once and consumes one delay topic.
type delayScope struct {
	topic    string
	maxDelay time.Duration
	mu       sync.Mutex
	handled  map[string]time.Time // value -> when handled
	order    []string
}

func (s *delayScope) DelayedTopics() map[string]time.Duration {
	return map[string]time.Duration{s.topic: s.maxDelay}
}

func (s *delayScope) Process(_ context.Context, batch []*consumer.Record, done func(*consumer.Record)) {
	for _, r := range batch {
		s.mu.Lock()
		s.handled[string(r.Value)] = time.Now()
		s.order = append(s.order, string(r.Value))
		s.mu.Unlock()
		done(r)
	}
}

func (s *delayScope) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.handled)
}

func dueHeader(t time.Time) []kgo.RecordHeader {
	return []kgo.RecordHeader{{Key: consumer.HeaderDue, Value: []byte(strconv.FormatInt(t.UnixMilli(), 10))}}
}

// A record of a delay topic is not handled before its due time; the records
// behind it in its partition wait too, other partitions do not; a forged
// far-future or corrupt due time cannot block the partition.
func TestDelayTopicHoldsRecordsUntilDue(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const src, delay = "src", "g-hold.kscope-retry-1s"
	if err := k.CreateTopic(ctx, src, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.CreateTopic(ctx, delay, 2); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Due times travel in whole milliseconds.
	// Far enough ahead that the record is fetched before it is due, even
	// on a broker where joining the group takes a second or two.
	due := time.UnixMilli(start.Add(2500 * time.Millisecond).UnixMilli())
	recs := []*kgo.Record{
		// partition 0: a record due later, then records due now: they
		// must wait behind it.
		{Topic: delay, Partition: 0, Value: []byte("p0-due"), Headers: dueHeader(due)},
		{Topic: delay, Partition: 0, Value: []byte("p0-after-1"), Headers: dueHeader(start)},
		{Topic: delay, Partition: 0, Value: []byte("p0-after-2")},
		// partition 1: forged far future, then corrupt: at most maxDelay.
		{Topic: delay, Partition: 1, Value: []byte("p1-forged"), Headers: dueHeader(start.Add(365 * 24 * time.Hour))},
		{Topic: delay, Partition: 1, Value: []byte("p1-corrupt"), Headers: []kgo.RecordHeader{{Key: consumer.HeaderDue, Value: []byte("soon")}}},
		{Topic: src, Value: []byte("source")},
	}
	cl, err := k.Client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	s := &delayScope{topic: delay, maxDelay: 5 * time.Second, handled: map[string]time.Time{}}
	cfg := baseConfig(t, k, "g-hold", src)
	r, err := consumer.NewScoped(cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record handled", func() bool { return s.count() == len(recs) })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, "g-hold", delay) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	at := func(v string) time.Time { return s.handled[v] }
	if at("p0-due").Before(due) {
		t.Fatalf("handled %s before its due time", at("p0-due").Sub(due))
	}
	if late := at("p0-due").Sub(due); late > time.Second {
		t.Fatalf("handled %s after its due time", late)
	}
	if at("p0-after-1").Before(at("p0-due")) || at("p0-after-2").Before(at("p0-after-1")) {
		t.Fatalf("records overtook the held record of their partition: %v", s.order)
	}
	if at("source").After(at("p0-due")) {
		t.Fatal("the source topic waited for the delay topic")
	}
	if el := at("p1-forged").Sub(start); el > 5*time.Second+time.Second {
		t.Fatalf("a forged far-future due time held its partition for %s, limit the 5s maxDelay", el)
	}
	if at("p1-corrupt").Before(at("p1-forged")) {
		t.Fatal("a record overtook the forged one in its partition")
	}
	st := r.Stats()
	if st.Held != 0 || st.InFlight != 0 {
		t.Fatalf("after the run: %d held, %d in flight", st.Held, st.InFlight)
	}
	var released int64
	for _, n := range st.RetryLateness.Counts {
		released += n
	}
	// p0-due is always held; the records behind it are held too when they
	// arrive in the same fetch, which depends on how the broker batches.
	// p0-after-1 was due at start and waited behind p0-due: its lateness
	// is p0-due's wait.
	if released < 1 || st.RetryLateness.Max > due.Sub(start)+time.Second {
		t.Fatalf("lateness %+v: want the held releases counted, none a second later than the record ahead of it", st.RetryLateness)
	}
}

// DueOf: a due time a little beyond the delay is clamped, one far beyond it
// is due now, and a clamped time is reached as the header's time comes
// nearer, so reading it again later never holds a record longer.
func TestDueOfClampsFarFutureTimes(t *testing.T) {
	const maxDelay = 10 * time.Second
	now := time.UnixMilli(time.Now().UnixMilli())
	rec := func(due time.Time) *consumer.Record {
		return &consumer.Record{Record: &kgo.Record{Headers: dueHeader(due)}}
	}
	cases := []struct {
		name string
		due  time.Time
		want time.Time
	}{
		{"within the delay", now.Add(3 * time.Second), now.Add(3 * time.Second)},
		{"a clock somewhat ahead", now.Add(15 * time.Second), now.Add(maxDelay)},
		{"far future", now.Add(24 * time.Hour), now},
		{"year 9999", time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), now},
	}
	for _, c := range cases {
		got, ok := consumer.DueOf(rec(c.due), now, maxDelay)
		if !ok || !got.Equal(c.want) {
			t.Errorf("%s: DueOf = %v, %v; want %v", c.name, got, ok, c.want)
		}
	}
	// Read again after 9s (a rewind): the 15s header is 6s ahead now.
	if got, _ := consumer.DueOf(rec(now.Add(15*time.Second)), now.Add(9*time.Second), maxDelay); !got.Equal(now.Add(15 * time.Second)) {
		t.Errorf("read again: DueOf = %v, want the header's own time", got)
	}
}
