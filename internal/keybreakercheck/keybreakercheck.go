// Package keybreakercheck is the test of the circuit breaker of each key
// (consumer.Config.KeyBreaker) that every scope passes: of Keys keys, one
// fails (its dependency is down); it is held alone, its later records
// waiting behind it, while the other keys' records are served; nothing
// goes to the retry topics or the dead-letter topic; each probe calls the
// handler once; when the key's dependency recovers, its records are
// served once, in order. Each scope's tests run it with their own runner.
package keybreakercheck

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/checkkit"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// The check's input: Topic, of Partitions partitions, holds Keys keys of
// PerKey records each, valued "k<key>-<n>", then Later more records of
// the failing key and of a few others, produced while it is held.
const (
	Topic      = "kbc-in"
	Partitions = 4
	Keys       = 1000
	PerKey     = 2
	Later      = 2
	// Failing is the key whose dependency is down.
	Failing = "k7"
	// Failures is how many failures of a key hold it (the in-place
	// attempts: a record failing alone holds its key on its last).
	Failures = 3
)

// ErrDown is the failing key's error while its dependency is down.
var ErrDown = errors.New("keybreakercheck: the key's dependency is down")

// Dep is the dependency the handlers of the scope under test call: down
// for the Failing key until the check brings it back.
type Dep struct {
	down     atomic.Bool
	failures atomic.Int64 // calls that failed with ErrDown

	mu     sync.Mutex
	served map[string]int   // value → calls that succeeded
	order  map[string][]int // key → the n of its values, in the order served
}

// Call is the handler's call of the dependency for rec: ErrDown for the
// failing key while it is down; else rec is served.
func (d *Dep) Call(rec *consumer.Record) error {
	if string(rec.Key) == Failing && d.down.Load() {
		d.failures.Add(1)
		return fmt.Errorf("serving %s: %w", rec.Value, ErrDown)
	}
	var n int
	if _, err := fmt.Sscanf(string(rec.Value)[strings.IndexByte(string(rec.Value), '-')+1:], "%d", &n); err != nil {
		return consumer.Terminal(fmt.Errorf("keybreakercheck: a value not of the check's: %q", rec.Value))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.served[string(rec.Value)]++
	d.order[string(rec.Key)] = append(d.order[string(rec.Key)], n)
	return nil
}

// Served returns how many records were served, each counted once.
func (d *Dep) Served() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.served)
}

// NewRunner builds the runner of the scope under test from cfg, whose
// handler calls dep (Dep.Call) for each record.
type NewRunner func(cfg consumer.Config, dep *Dep) (*consumer.Runner, error)

// Config returns the check's runner configuration: a key breaker with a
// short cool-down, the default in-place attempts, a ladder of retry
// topics (so that a record failing alone would go there without the
// breaker).
func Config(k *testenv.Kafka, group string) consumer.Config {
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("KSCOPE_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{Topic},
		Shards: 8, CommitInterval: 50 * time.Millisecond, DrainTimeout: 5 * time.Second, Logger: logger,
		Failures: retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Ladder: []time.Duration{time.Second}},
		KeyBreaker: &consumer.KeyBreakerConfig{
			Trips:    func(err error) bool { return errors.Is(err, ErrDown) },
			Failures: Failures, OpenFor: 200 * time.Millisecond, MaxOpenFor: 400 * time.Millisecond,
		},
	}
}

// Check is what a scope's test checks beyond the common part.
type Check struct {
	// Held runs while the failing key is held and every other key's
	// records were served.
	Held func(t *testing.T, r *consumer.Runner)
}

// Run runs the check on the runner newRunner builds, and returns its
// dependency.
func Run(t *testing.T, k *testenv.Kafka, group string, newRunner NewRunner, c Check) *Dep {
	ctx := context.Background()
	if err := k.CreateTopic(ctx, Topic, Partitions); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for n := range PerKey {
		for key := range Keys {
			recs = append(recs, record(fmt.Sprintf("k%d", key), n))
		}
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	dep := &Dep{served: map[string]int{}, order: map[string][]int{}}
	dep.down.Store(true)
	r, err := newRunner(Config(k, group), dep)
	if err != nil {
		t.Fatal(err)
	}
	checkkit.Run(t, r)

	// The failing key is held; every other key flows.
	testenv.WaitFor(t, time.Minute, "the other keys served", func() bool { return dep.Served() == (Keys-1)*PerKey })
	var later []*kgo.Record
	for n := PerKey; n < PerKey+Later; n++ {
		for _, key := range []string{Failing, "k1", "k2", "k3"} {
			later = append(later, record(key, n))
		}
	}
	if err := k.Produce(ctx, later...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the other keys' later records served", func() bool { return dep.Served() == (Keys-1)*PerKey+3*Later })
	testenv.WaitFor(t, time.Minute, "two failed probes", func() bool { return probesFailed(r) >= 2 })
	if c.Held != nil {
		c.Held(t, r)
	}
	if n := checkkit.Routed(t, k, group); n > 0 {
		t.Errorf("%d records in the retry and dead-letter topics while the key is held; want none", n)
	}

	// The key's dependency recovers: the next probe succeeds, the key's
	// records run in order.
	dep.down.Store(false)
	total := len(recs) + len(later)
	testenv.WaitFor(t, time.Minute, "every record served and committed", func() bool {
		return dep.Served() == total && k.CaughtUp(ctx, group, Topic)
	})
	if failed, probes := dep.failures.Load(), r.Stats().KeyBreaker.Probes; failed > Failures+probes {
		t.Errorf("%d calls of the failing key failed with %d probes; want at most %d: the failures that held it, then one call per probe", failed, probes, Failures+probes)
	}
	checkServed(t, dep, total)
	if n := checkkit.Routed(t, k, group); n > 0 {
		t.Errorf("%d records in the retry and dead-letter topics; want none: a held key is not retried through them", n)
	}
	if f := r.Stats().Failures; f.DeadLettered != 0 || f.RetryTopic != 0 {
		t.Errorf("Stats.Failures %+v; want nothing dead-lettered or sent to a retry topic", f)
	}
	return dep
}

// probesFailed returns how many of the key breaker's probes failed.
func probesFailed(r *consumer.Runner) int64 {
	return r.Stats().KeyBreaker.FailedProbes
}

func record(key string, n int) *kgo.Record {
	return &kgo.Record{Topic: Topic, Key: []byte(key), Value: fmt.Appendf(nil, "%s-%d", key, n)}
}

// checkServed checks every record was served once, each key's in order.
func checkServed(t *testing.T, d *Dep, want int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.served) != want {
		t.Errorf("%d records served; want %d", len(d.served), want)
	}
	for v, n := range d.served {
		if n != 1 {
			t.Errorf("record %s served %d times; want once", v, n)
		}
	}
	for key, ns := range d.order {
		for i, n := range ns {
			if n != i {
				t.Errorf("key %s served in the order %v; want 0, 1, … in order", key, ns)
				break
			}
		}
	}
}
