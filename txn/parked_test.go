package txn_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
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

// produceCopy produces version v of key with value and a message-id
// header (its identity).
func produceCopy(t *testing.T, k *testenv.Kafka, key, v, value, id string) {
	t.Helper()
	rec := &kgo.Record{Topic: "in", Key: []byte(key), Value: []byte(value), Headers: []kgo.RecordHeader{
		{Key: "version", Value: []byte(v)}, {Key: consumer.DefaultMessageIDHeader, Value: []byte(id)},
	}}
	if err := k.Produce(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
}

// emitValue emits each record's value to "out", and fails those whose
// value ends in "bad" as Terminal.
var emitValue = txn.HandlerFunc(func(_ context.Context, r *consumer.Record, out txn.Emitter) error {
	if strings.HasSuffix(string(r.Value), "bad") {
		return consumer.Terminal(errors.New("refused"))
	}
	out.Emit(&kgo.Record{Topic: "out", Key: r.Key, Value: r.Value})
	return nil
})

// outputsByKey reads "out" and the DLT of group: the values of each key,
// in order.
func outputsByKey(t *testing.T, k *testenv.Kafka, group string) (out, dlt map[string][]string) {
	t.Helper()
	out, dlt = map[string][]string{}, map[string][]string{}
	for _, r := range k.ReadAll(t, "out") {
		out[string(r.Key)] = append(out[string(r.Key)], string(r.Value))
	}
	for _, r := range k.ReadAll(t, retrytopic.DLTopic(group)) {
		dlt[string(r.Key)] = append(dlt[string(r.Key)], string(r.Value))
	}
	return out, dlt
}

// A parked record delivered again, with its identity (a producer's
// retry) or at its own offset (a replay), stays parked as it was: it is
// applied once when its gap fills.
func TestRedeliveredParkedRecordStaysParked(t *testing.T) {
	k := setup(t)
	const group = "g-park-redelivered"
	d := newDeliveries()
	cfg := config(k, group)
	cfg.Hooks = []hook.Hook{d}
	start := func(id string) (*txn.Runner, func() error) {
		t.Helper()
		r, err := txn.New(cfg, txn.Options{TransactionalID: id, Versions: &sequence.Config{GapTimeout: time.Hour}}, emitValue)
		if err != nil {
			t.Fatal(err)
		}
		return r, runFor(t, r)
	}
	produceCopy(t, k, "acct", "1", "1", "acct-1")
	produceCopy(t, k, "acct", "3", "3", "acct-3")
	produceCopy(t, k, "acct", "3", "3", "acct-3") // the producer's retry
	r1, stop := start("redelivered-1")
	testenv.WaitFor(t, 20*time.Second, "every record checked", func() bool { return r1.Stats().Kafka.Records == 3 })
	if s := r1.Stats().Kafka; s.GapsDetected != 1 || s.DeadLettered != 0 || s.Outputs != 1 {
		t.Fatalf("run 1: %+v; want 1 gap (the retry of 3 stays as it was), nothing dead-lettered, 1 output", s)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// A replay from the start delivers 3 again at its own offset.
	offsets := kadm.Offsets{}
	for p := range int32(3) {
		offsets.Add(kadm.Offset{Topic: "in", Partition: p, At: 0, LeaderEpoch: -1})
	}
	resp, err := k.Admin().CommitOffsets(context.Background(), group, offsets)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	r2, stop := start("redelivered-2")
	testenv.WaitFor(t, 20*time.Second, "the replay checked", func() bool { return r2.Stats().Kafka.Records == 3 })
	produceCopy(t, k, "acct", "2", "2", "acct-2")
	testenv.WaitFor(t, 20*time.Second, "the gap healed", func() bool { return r2.Stats().Kafka.GapsHealed == 1 })
	if s := r2.Stats().Kafka; s.GapsDetected != 0 || s.Stale != 1 || s.DeadLettered != 0 || s.Outputs != 2 {
		t.Fatalf("run 2: %+v; want no new gap, 1 stale (1), nothing dead-lettered, 2 outputs (2, 3)", s)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	out, dlt := outputsByKey(t, k, group)
	if fmt.Sprint(out["acct"]) != "[1 2 3]" || len(dlt) != 0 {
		t.Fatalf("outputs %v, dead letters %v; want [1 2 3] and none", out, dlt)
	}
	d.check(t, "")
}

// Another record with the version of a parked record (another identity:
// a producer that sent a version twice) waits with it and ends as in the
// DB scope, where it waits behind the parked head: stale when the parked
// record is applied, applied in its place when the parked record is
// dead-lettered, and dead-lettered with it when the gap times out.
func TestAnotherRecordWithAParkedVersion(t *testing.T) {
	k := setup(t)
	const group = "g-park-another"
	d := newDeliveries()
	cfg := config(k, group)
	cfg.Hooks = []hook.Hook{d}
	start := func(id string, gapTimeout time.Duration) (*txn.Runner, func() error) {
		t.Helper()
		r, err := txn.New(cfg, txn.Options{TransactionalID: id, Versions: &sequence.Config{GapTimeout: gapTimeout}}, emitValue)
		if err != nil {
			t.Fatal(err)
		}
		return r, runFor(t, r)
	}
	for _, key := range []string{"applied", "replaced", "expired"} {
		produceCopy(t, k, key, "1", "1", key+"-1")
	}
	produceCopy(t, k, "applied", "3", "3a", "applied-3a")
	produceCopy(t, k, "applied", "3", "3b", "applied-3b")
	produceCopy(t, k, "replaced", "3", "3a-bad", "replaced-3a")
	produceCopy(t, k, "replaced", "3", "3b", "replaced-3b")
	produceCopy(t, k, "expired", "3", "3a", "expired-3a")
	produceCopy(t, k, "expired", "3", "3b", "expired-3b")
	r1, stop := start("another-1", time.Hour)
	testenv.WaitFor(t, 20*time.Second, "every record checked", func() bool { return r1.Stats().Kafka.Records == 9 })
	if s := r1.Stats().Kafka; s.GapsDetected != 6 {
		t.Errorf("run 1: %+v; want 6 gaps (every copy of 3 parked)", s)
	}
	// 2 fills the gaps of applied and replaced; their copies of 3 are
	// released in its transaction.
	produceCopy(t, k, "applied", "2", "2", "applied-2")
	produceCopy(t, k, "replaced", "2", "2", "replaced-2")
	testenv.WaitFor(t, 20*time.Second, "2 applied", func() bool { return r1.Stats().Kafka.Records == 11 })
	if s := r1.Stats().Kafka; s.GapsHealed != 2 || s.Stale != 1 || s.DeadLettered != 1 || s.GapsTimedOut != 0 {
		t.Errorf("run 1: %+v; want 2 healed (applied's 3a, replaced's 3b), 1 stale (applied's 3b), 1 dead-lettered (replaced's 3a-bad)", s)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// The next runner times expired's gap out: both copies of 3 go to
	// the DLT, in one transaction.
	r2, stop := start("another-2", time.Millisecond)
	testenv.WaitFor(t, 20*time.Second, "expired's gap timed out", func() bool { return r2.Stats().Kafka.GapsTimedOut > 0 })
	if s := r2.Stats().Kafka; s.GapsTimedOut != 2 || s.DeadLettered != 2 {
		t.Errorf("run 2: %+v; want 2 timed out and dead-lettered", s)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	out, dlt := outputsByKey(t, k, group)
	wantOut := map[string][]string{"applied": {"1", "2", "3a"}, "replaced": {"1", "2", "3b"}, "expired": {"1"}}
	wantDLT := map[string][]string{"replaced": {"3a-bad"}, "expired": {"3a", "3b"}}
	if fmt.Sprint(out) != fmt.Sprint(wantOut) || fmt.Sprint(dlt) != fmt.Sprint(wantDLT) {
		t.Fatalf("outputs %v, dead letters %v; want %v and %v", out, dlt, wantOut, wantDLT)
	}
	for _, r := range k.ReadAll(t, retrytopic.DLTopic(group)) {
		if string(r.Key) == "expired" && (testenv.Header(r, retrytopic.HeaderVersionExpected) != "2" || testenv.Header(r, retrytopic.HeaderVersionActual) != "3") {
			t.Fatalf("timed-out copy %s lacks expected=2 / actual=3 version headers", r.Value)
		}
	}
	// Each 3b is parked, then stale, applied or dead-lettered.
	got := d.check(t, "3b")
	slices.Sort(got)
	if want := []hook.Outcome{hook.OutcomeDeadLettered, hook.OutcomeGap, hook.OutcomeGap, hook.OutcomeGap, hook.OutcomeStale, hook.OutcomeSuccess}; !slices.Equal(got, want) {
		t.Fatalf("deliveries of the 3b copies ended %v, want %v", got, want)
	}
}
