package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// waitFor polls cond until it holds or the deadline passes; it is a wait on
// a condition, not a sleep standing in for synchronisation.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("KSCOPE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// produceKeyed writes perKey records for each of keys keys, round-robin over
// the keys, so a key's records interleave with others'. A record's value is
// "key/seq" with seq counting from 0 per key.
func produceKeyed(t testing.TB, k *testenv.Kafka, topic string, keys, perKey int) int {
	t.Helper()
	recs := make([]*kgo.Record, 0, keys*perKey)
	for s := 0; s < perKey; s++ {
		for i := 0; i < keys; i++ {
			key := fmt.Sprintf("k%03d", i)
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(key + "/" + strconv.Itoa(s))})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(recs) > 0 {
		n := min(len(recs), 1000)
		if err := k.Produce(ctx, recs[:n]...); err != nil {
			t.Fatal(err)
		}
		recs = recs[n:]
	}
	return keys * perKey
}

// observer records what handlers saw and detects two handlers running at once
// for one key.
type observer struct {
	mu       sync.Mutex
	seqs     map[string][]int // per key, the sequence numbers in handling order
	handled  atomic.Int64
	active   sync.Map // key -> *atomic.Int32
	overlaps atomic.Int64
	unique   map[string]bool
}

func newObserver() *observer {
	return &observer{seqs: make(map[string][]int), unique: make(map[string]bool)}
}

// enter marks the start of handling r and returns the function that marks its
// end; it counts an overlap when another handler runs for the same key.
func (o *observer) enter(r *consumer.Record) func() {
	c, _ := o.active.LoadOrStore(string(r.Key), new(atomic.Int32))
	n := c.(*atomic.Int32)
	if n.Add(1) != 1 {
		o.overlaps.Add(1)
	}
	return func() { n.Add(-1) }
}

func (o *observer) record(r *consumer.Record) {
	key, seqS, _ := strings.Cut(string(r.Value), "/")
	seq, _ := strconv.Atoi(seqS)
	o.mu.Lock()
	o.seqs[key] = append(o.seqs[key], seq)
	o.unique[string(r.Value)] = true
	o.mu.Unlock()
	o.handled.Add(1)
}

func (o *observer) uniqueCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.unique)
}

// checkStrictOrder asserts that every key saw 0..perKey-1 exactly once, in
// order.
func (o *observer) checkStrictOrder(t testing.TB, keys, perKey int) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.seqs) != keys {
		t.Fatalf("saw %d keys, want %d", len(o.seqs), keys)
	}
	for k, s := range o.seqs {
		if len(s) != perKey {
			t.Fatalf("key %s: handled %d records, want %d: %v", k, len(s), perKey, s)
		}
		for i, v := range s {
			if v != i {
				t.Fatalf("key %s: out of order at %d: %v", k, i, s)
			}
		}
	}
}

// checkOrderWithReplays asserts per-key order where at-least-once redelivery
// may replay a suffix: each step goes to the next sequence number or back to
// an earlier one (a redelivery from the last commit), never skips ahead, and
// every sequence number 0..perKey-1 was seen.
func (o *observer) checkOrderWithReplays(t testing.TB, keys, perKey int) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.seqs) != keys {
		t.Fatalf("saw %d keys, want %d", len(o.seqs), keys)
	}
	for k, s := range o.seqs {
		seen := make([]bool, perKey)
		prev := -1
		for i, v := range s {
			if v > prev+1 {
				t.Fatalf("key %s: skipped from %d to %d at %d: %v", k, prev, v, i, s)
			}
			seen[v] = true
			prev = v
		}
		for v, ok := range seen {
			if !ok {
				t.Fatalf("key %s: record %d never handled (lost)", k, v)
			}
		}
	}
}

// runAsync runs r in a goroutine and returns a function that stops it and
// returns Run's error.
func runAsync(t testing.TB, r *consumer.Runner) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(time.Minute):
				err = fmt.Errorf("Run did not return within a minute of cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// committedAll reports whether group's committed offsets reach the end of
// every partition of topic.
func committedAll(t testing.TB, k *testenv.Kafka, group, topic string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := k.EndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	com, err := k.CommittedOffsets(ctx, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	for p, end := range ends {
		if end > 0 && com[p] != end {
			return false
		}
	}
	return true
}

func baseConfig(t testing.TB, k *testenv.Kafka, group string, topics ...string) consumer.Config {
	return consumer.Config{
		Brokers:        k.Brokers,
		Group:          group,
		Topics:         topics,
		CommitInterval: 50 * time.Millisecond,
		DrainTimeout:   5 * time.Second,
		Logger:         testLogger(t),
	}
}
