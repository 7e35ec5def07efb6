// Package breakercheck is the test of a circuit breaker
// (consumer.Config.Breakers) that every scope passes: a dependency that
// goes down opens the breaker after its failures, nothing goes to the
// retry topics or the dead-letter topic and nothing is fetched while it is
// open, it half-opens and lets one probe through, and when the dependency
// recovers it closes and every record is served once, in key order. Each
// scope's tests run it with their own runner.
package breakercheck

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
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/checkkit"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// The check's input: Topic, of Partitions partitions, holds Keys keys of
// PerKey records each, valued "k<key>-<n>".
const (
	Topic      = "bc-in"
	Partitions = 2
	Keys       = 5
	PerKey     = 8
	// Failures is how many failures open the check's breaker.
	Failures = 3
	// Shards is the check's Config.Shards: at most this many calls are
	// out when the breaker opens.
	Shards = 4
)

// ErrDown is the dependency's error while it is down; the check's
// breaker matches it.
var ErrDown = errors.New("breakercheck: the dependency is down")

// Dep is the dependency the handlers of the scope under test call, with
// the switch that takes it down.
type Dep struct {
	down     atomic.Bool
	failures atomic.Int64 // calls that failed with ErrDown

	mu     sync.Mutex
	served map[string]int   // value → calls that succeeded
	order  map[string][]int // key → the n of its values, in the order served
}

// Call is the handler's call of the dependency for rec: ErrDown while it
// is down; else rec is served.
func (d *Dep) Call(rec *consumer.Record) error {
	if d.down.Load() {
		d.failures.Add(1)
		return fmt.Errorf("calling the dependency for %s: %w", rec.Value, ErrDown)
	}
	var n int
	if _, err := fmt.Sscanf(string(rec.Value)[strings.IndexByte(string(rec.Value), '-')+1:], "%d", &n); err != nil {
		return consumer.Terminal(fmt.Errorf("breakercheck: a value not of the check's: %q", rec.Value))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.served[string(rec.Value)]++
	d.order[string(rec.Key)] = append(d.order[string(rec.Key)], n)
	return nil
}

// NewRunner builds the runner of the scope under test from cfg, whose
// handler calls dep (Dep.Call) for each record.
type NewRunner func(cfg consumer.Config, dep *Dep) (*consumer.Runner, error)

// Config is the configuration the check passes to NewRunner: its
// breaker, "dep", opens after Failures failures matching ErrDown and
// stays open for openFor.
func Config(k *testenv.Kafka, group string, openFor time.Duration, h hook.Hook) consumer.Config {
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("KSCOPE_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{Topic},
		Shards: Shards, CommitInterval: 50 * time.Millisecond, DrainTimeout: 5 * time.Second,
		Logger: logger, Hooks: []hook.Hook{h},
		Breakers: []consumer.BreakerConfig{{
			Name: "dep", Trips: func(err error) bool { return errors.Is(err, ErrDown) },
			Failures: Failures, Window: time.Minute, OpenFor: openFor,
		}},
	}
}

// transitions is a hook that notes the breaker's states in turn.
type transitions struct {
	mu     sync.Mutex
	states []string
	errs   []error
}

func (tr *transitions) OnBreaker(b hook.Breaker) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.states = append(tr.states, b.State)
	tr.errs = append(tr.errs, b.Err)
}

func (tr *transitions) list() ([]string, []error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.states...), append([]error(nil), tr.errs...)
}

// Run checks a breaker in the scope newRunner builds (see the package
// doc), and returns the dependency, once every record was served.
func Run(t *testing.T, k *testenv.Kafka, group string, newRunner NewRunner) *Dep {
	ctx := context.Background()
	if err := k.CreateTopic(ctx, Topic, Partitions); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for n := range PerKey {
		for key := range Keys {
			recs = append(recs, &kgo.Record{Topic: Topic, Key: fmt.Appendf(nil, "k%d", key), Value: fmt.Appendf(nil, "k%d-%d", key, n)})
		}
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	dep := &Dep{served: map[string]int{}, order: map[string][]int{}}
	dep.down.Store(true)
	tr := &transitions{}
	r, err := newRunner(Config(k, group, 300*time.Millisecond, tr), dep)
	if err != nil {
		t.Fatal(err)
	}
	checkkit.Run(t, r)

	// Down: the breaker opens, pauses fetching, and probes in turn.
	testenv.WaitFor(t, time.Minute, "the breaker open", func() bool { return state(r).State == consumer.BreakerOpen })
	testenv.WaitFor(t, time.Minute, "the breaker's failed probes", func() bool { return state(r).Trips >= 3 })
	failed, trips := dep.failures.Load(), state(r).Trips
	if max := int64(Failures+Shards) + trips; failed > max {
		t.Errorf("%d calls failed while the dependency was down, after %d trips; want at most %d: the failures that opened it, the calls out then, one probe each time it half-opened", failed, trips, max)
	}
	testenv.WaitFor(t, time.Minute, "fetching paused while the breaker is open", func() bool {
		st := state(r)
		return st.State == consumer.BreakerOpen && pausedByBreaker(r) && clientPaused(r) == Partitions
	})
	if n := checkkit.Routed(t, k, group); n > 0 {
		t.Errorf("%d records in the retry and dead-letter topics while the breaker is open; want none", n)
	}

	// Up: the next probe succeeds, the breaker closes, everything flows.
	dep.down.Store(false)
	testenv.WaitFor(t, time.Minute, "every record served and committed", func() bool {
		return dep.count() == len(recs) && k.CaughtUp(ctx, group, Topic)
	})
	if st := state(r); st.State != consumer.BreakerClosed {
		t.Errorf("breaker %+v after the dependency recovered; want closed", st)
	}
	if pausedByBreaker(r) {
		t.Errorf("pauses %+v after the breaker closed; want none of the breaker's", r.Paused())
	}
	checkTransitions(t, tr)
	checkServed(t, dep, len(recs))
	if n := checkkit.Routed(t, k, group); n > 0 {
		t.Errorf("%d records in the retry and dead-letter topics; want none: a breaker's wait is not a retry", n)
	}
	if f := r.Stats().Failures; f.DeadLettered != 0 || f.RetryTopic != 0 {
		t.Errorf("Stats.Failures %+v; want nothing dead-lettered or sent to a retry topic", f)
	}
	return dep
}

func state(r *consumer.Runner) consumer.BreakerState {
	bs := r.Stats().Breakers
	if len(bs) != 1 {
		return consumer.BreakerState{State: -1}
	}
	return bs[0]
}

func pausedByBreaker(r *consumer.Runner) bool {
	for _, p := range r.Paused() {
		if p.Reason == "breaker dep" {
			return true
		}
	}
	return false
}

func clientPaused(r *consumer.Runner) int {
	cl := r.Client()
	if cl == nil {
		return -1
	}
	return len(cl.PauseFetchPartitions(nil)[Topic])
}

// checkTransitions checks that each change of state was reported once:
// open and half-open in turn, the failing dependency's error with each
// open, and closed at the end.
func checkTransitions(t *testing.T, tr *transitions) {
	states, errs := tr.list()
	for i, s := range states {
		want := "open"
		switch {
		case i == len(states)-1:
			want = "closed"
		case i%2 == 1:
			want = "half-open"
		}
		if s != want {
			t.Fatalf("breaker transitions %v; want open and half-open in turn, then closed", states)
		}
		if s == "open" && !errors.Is(errs[i], ErrDown) {
			t.Errorf("transition %d to open carries %v; want the dependency's error", i, errs[i])
		}
	}
	if len(states) < 6 || len(states)%2 != 1 {
		t.Errorf("breaker transitions %v; want at least three opens, each followed by half-open, then closed", states)
	}
}

func (d *Dep) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.served)
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
				t.Errorf("key %s served in the order %v; want 0..%d in order", key, ns, PerKey-1)
				break
			}
		}
	}
}
