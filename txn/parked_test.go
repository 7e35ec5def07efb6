package txn_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// deliveries is a hook.RecordHook that keeps every delivery's start and
// ends. Armed with a value, it holds the next delivery of a record with
// that value in OnRecordStart until the delivery's context ends (the
// runner stops), once.
type deliveries struct {
	mu      sync.Mutex
	starts  []*kgo.Record
	ends    map[*kgo.Record][]hook.Outcome
	hold    string
	holding chan struct{}
}

func newDeliveries() *deliveries {
	return &deliveries{ends: map[*kgo.Record][]hook.Outcome{}}
}

// arm makes the next delivery of a record with value v wait in
// OnRecordStart until its context ends; the channel is closed once it
// waits.
func (d *deliveries) arm(v string) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hold, d.holding = v, make(chan struct{})
	return d.holding
}

func (d *deliveries) OnRecordStart(ctx context.Context, s hook.RecordStart) context.Context {
	d.mu.Lock()
	d.starts = append(d.starts, s.Record)
	hold := d.hold != "" && string(s.Record.Value) == d.hold
	if hold {
		d.hold = ""
		close(d.holding)
	}
	d.mu.Unlock()
	if hold {
		<-ctx.Done()
	}
	return ctx
}

func (d *deliveries) OnRecordEnd(_ context.Context, e hook.RecordEnd) {
	d.mu.Lock()
	d.ends[e.Record] = append(d.ends[e.Record], e.Outcome)
	d.mu.Unlock()
}

// check fails t unless every delivery started ended exactly once, and
// returns the outcomes of the deliveries of the records with value v, in
// the order they started.
func (d *deliveries) check(t *testing.T, v string) []hook.Outcome {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	var of []hook.Outcome
	for _, r := range d.starts {
		ends := d.ends[r]
		if len(ends) != 1 {
			t.Errorf("the delivery of %s (%s[%d]@%d) ended %d times %v, want once", r.Value, r.Topic, r.Partition, r.Offset, len(ends), ends)
		}
		if string(r.Value) == v {
			of = append(of, ends...)
		}
	}
	return of
}

// A gap that fills releases the parked records after it one after
// another; when the runner stops partway, the deliveries of those already
// handled, whose work no transaction takes, end as aborted.
func TestReleasedParkedDeliveriesEndWhenTheRunnerStops(t *testing.T) {
	k := setup(t)
	d := newDeliveries()
	cfg := config(k, "g-release-stop")
	cfg.Hooks = []hook.Hook{d}
	produceVersion(t, k, "acct", "1")
	produceVersion(t, k, "acct", "3")
	produceVersion(t, k, "acct", "4")
	r, err := txn.New(cfg, txn.Options{TransactionalID: "release-stop", Versions: &sequence.Config{GapTimeout: time.Hour}}, versioned(t))
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, 20*time.Second, "3 and 4 parked", func() bool { return r.Stats().Kafka.GapsDetected == 2 })

	// 2 fills the gap: 3 is released and handled, then the runner stops
	// while 4's delivery starts.
	holding := d.arm("acct@4")
	produceVersion(t, k, "acct", "2")
	<-holding
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := d.check(t, "acct@3"); fmt.Sprint(got) != fmt.Sprint([]hook.Outcome{hook.OutcomeGap, hook.OutcomeAborted}) {
		t.Fatalf("deliveries of acct@3 ended %v, want [gap aborted] (parked, then released and dropped)", got)
	}
	if got := d.check(t, "acct@2"); fmt.Sprint(got) != fmt.Sprint([]hook.Outcome{hook.OutcomeAborted}) {
		t.Fatalf("deliveries of acct@2 ended %v, want [aborted]", got)
	}
}

// A parked record that times out while the runner stops is not
// dead-lettered by a transaction: its delivery ends as aborted, and the
// next runner dead-letters it.
func TestExpiredParkedDeliveryEndsWhenTheRunnerStops(t *testing.T) {
	k := setup(t)
	d := newDeliveries()
	cfg := config(k, "g-expire-stop")
	cfg.Hooks = []hook.Hook{d}
	produceVersion(t, k, "acct", "1")
	produceVersion(t, k, "acct", "3")
	start := func(id string, gapTimeout time.Duration) (*txn.Runner, func() error) {
		t.Helper()
		r, err := txn.New(cfg, txn.Options{TransactionalID: id, Versions: &sequence.Config{GapTimeout: gapTimeout}}, versioned(t))
		if err != nil {
			t.Fatal(err)
		}
		return r, runFor(t, r)
	}
	r1, stop := start("expire-stop-1", time.Hour)
	testenv.WaitFor(t, 20*time.Second, "3 parked", func() bool { return r1.Stats().Kafka.GapsDetected == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// The next runner finds 3 timed out; it stops while 3's delivery
	// starts.
	holding := d.arm("acct@3")
	_, stop = start("expire-stop-2", time.Millisecond)
	<-holding
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := d.check(t, "acct@3"); fmt.Sprint(got) != fmt.Sprint([]hook.Outcome{hook.OutcomeGap, hook.OutcomeAborted}) {
		t.Fatalf("deliveries of acct@3 ended %v, want [gap aborted] (parked, then timed out and dropped)", got)
	}

	r3, stop := start("expire-stop-3", time.Millisecond)
	testenv.WaitFor(t, 20*time.Second, "3 timed out", func() bool { return r3.Stats().Kafka.GapsTimedOut == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := d.check(t, "acct@3"); fmt.Sprint(got) != fmt.Sprint([]hook.Outcome{hook.OutcomeGap, hook.OutcomeAborted, hook.OutcomeDeadLettered}) {
		t.Fatalf("deliveries of acct@3 ended %v, want [gap aborted dead_lettered]", got)
	}
}
