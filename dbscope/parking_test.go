package dbscope_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// headInRetryTopic produces A ("k/0"), the head of key k, and waits until
// the failure policy sent it to a retry topic: k's next records wait
// behind it.
func headInRetryTopic(t *testing.T, k *testenv.Kafka, r interface{ Stats() consumer.Stats }, topic string) {
	t.Helper()
	if err := k.Produce(context.Background(), idRecord(topic, "k", "k/0", "A")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "A in a retry topic", func() bool { return r.Stats().Failures.RetryTopic >= 1 })
}

// idRecord is a record of topic with key, value and a producer message id.
func idRecord(topic, key, value, id string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value),
		Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}}
}

// orderedPolicy is a failure policy with ordered retries through a short
// ladder: the first failure of a record sends it to the first retry topic.
func orderedPolicy(rungs, attempts int) retrytopic.Policy {
	ladder := make([]time.Duration, rungs)
	for i := range ladder {
		ladder[i] = time.Duration(100*(i+1)) * time.Millisecond
	}
	return retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		InPlaceAttempts: 1, Ladder: ladder, RetryableAttempts: attempts}
}

// countRetryRecords returns how many records the group's retry topics hold.
func countRetryRecords(t *testing.T, k *testenv.Kafka, group string, p retrytopic.Policy) int {
	t.Helper()
	n := 0
	for _, d := range p.Ladder {
		n += len(k.ReadAll(t, retrytopic.RetryTopic(group, d)))
	}
	return n
}

// A is in the retry topics; B and a redelivery B' of B (the same message
// id) arrive together, then D: the effects are A, B, D. The redelivery of
// a parked record neither releases it nor runs it.
func TestDBParkedRedeliveryKeepsOrder(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "payments", "g-park-redelivery"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Failures = orderedPolicy(2, 10)
	var aCalls atomic.Int32
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if string(r.Value) == "k/0" && aCalls.Add(1) <= 2 {
				return consumer.Retryable(errors.New("ledger service 503"))
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	headInRetryTopic(t, k, r, topic)
	if err := k.Produce(ctx, idRecord(topic, "k", "k/1", "B"), idRecord(topic, "k", "k/1", "B")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "B parked and B' found a duplicate", func() bool {
		return r.Stats().DB.Parked >= 1 && r.Stats().DB.Duplicates >= 1
	})
	if err := k.Produce(ctx, idRecord(topic, "k", "k/2", "D")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "A, B and D applied", func() bool { return r.Stats().DB.Applied >= 3 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(effectOrder(t, pool), ","); got != "k/0,k/1,k/2" {
		t.Fatalf("effects %s, want k/0,k/1,k/2", got)
	}
	if n := countRetryRecords(t, k, group, cfg.Failures); n != 2 {
		t.Fatalf("%d retry-topic records, want 2 (A's two hops; B and D wait in PostgreSQL)", n)
	}
}

// A record that failed through every rung of the ladder, with records of
// its key waiting behind it, puts at most one record per rung into the
// retry topics: the waiting records stay in PostgreSQL and are applied
// after it, in order.
func TestDBParkingBoundsRetryRecords(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "payments", "g-park-bound"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Failures = orderedPolicy(3, 4) // in place, then 3 hops, then the DLT
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if string(r.Value) == "k/0" {
				return consumer.Retryable(errors.New("never works"))
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, idRecord(topic, "k", "k/0", "k0")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "k/0 in the retry topics", func() bool { return r.Stats().Failures.RetryTopic >= 1 })
	const behind = 30
	var recs []*kgo.Record
	for i := 1; i <= behind; i++ {
		recs = append(recs, idRecord(topic, "k", fmt.Sprintf("k/%d", i), fmt.Sprintf("k%d", i)))
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the waiting records applied", func() bool { return r.Stats().DB.Applied == behind })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantKeyOrder(t, pool)
	if c := countEffects(t, pool); c.rows != behind || c.unique != behind {
		t.Fatalf("effects %+v, want %d", c, behind)
	}
	if n := countRetryRecords(t, k, group, cfg.Failures); n > len(cfg.Failures.Ladder)+1 {
		t.Fatalf("%d retry-topic records for one failed record, want at most %d", n, len(cfg.Failures.Ladder)+1)
	}
	if dlt := k.ReadAll(t, retrytopic.DLTopic(group)); len(dlt) != 1 {
		t.Fatalf("%d DLT records, want 1", len(dlt))
	}
}

// A dead-lettered record's identity is remembered: a redelivery of it, or
// of the head of a key released by the DLT, is a no-op and adds no second
// dead letter.
func TestDBDeadLetteredRedeliveryIsNoOp(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "payments", "g-park-dlt"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Failures = orderedPolicy(1, 2)
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			switch string(r.Value) {
			case "poison/0":
				return consumer.DecodeError(errors.New("amount is not a number"))
			case "k/0":
				return consumer.Retryable(errors.New("never works"))
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, idRecord(topic, "poison", "poison/0", "P"), idRecord(topic, "k", "k/0", "K0")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "k/0 in the retry topics", func() bool { return r.Stats().Failures.RetryTopic >= 1 })
	if err := k.Produce(ctx, idRecord(topic, "k", "k/1", "K1")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "both dead-lettered, k/1 applied", func() bool {
		return r.Stats().Failures.DeadLettered == 2 && r.Stats().DB.Applied == 1
	})
	// Redeliveries of the dead-lettered records and of the applied one.
	if err := k.Produce(ctx, idRecord(topic, "poison", "poison/0", "P"), idRecord(topic, "k", "k/0", "K0"),
		idRecord(topic, "k", "k/1", "K1"), idRecord(topic, "k", "k/2", "K2")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "k/2 applied", func() bool { return r.Stats().DB.Applied == 2 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(effectOrder(t, pool), ","); got != "k/1,k/2" {
		t.Fatalf("effects %s, want k/1,k/2", got)
	}
	if dlt := k.ReadAll(t, retrytopic.DLTopic(group)); len(dlt) != 2 {
		t.Fatalf("%d DLT records, want 2: a redelivery of a dead-lettered record is a no-op", len(dlt))
	}
	if d := r.Stats().DB.Duplicates; d != 3 {
		t.Fatalf("%d duplicates, want 3", d)
	}
}

// A transaction that parks a record and dies before its commit (its
// backend terminated while the runner stops) leaves nothing: the next
// runner applies every record once, in per-key order.
func TestDBCrashBetweenParkingAndCommit(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "payments", "g-park-crash"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1
	cfg.Failures = orderedPolicy(2, 10)
	var aCalls atomic.Int32
	var blockOnce sync.Once
	blocked := make(chan int32, 1) // the blocked handler's backend
	release := make(chan struct{})
	handler := func(block bool) dbscope.HandlerFunc {
		return func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if string(r.Value) == "k/0" && aCalls.Add(1) <= 2 {
				return consumer.Retryable(errors.New("ledger service 503"))
			}
			if block && string(r.Value) == "j/0" {
				held := false
				blockOnce.Do(func() { held = true })
				if held {
					var pid int32
					if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
						return err
					}
					blocked <- pid
					<-release
					return errors.New("the process died")
				}
			}
			return insertEffect(ctx, tx, r)
		}
	}
	r1, err := dbscope.New(cfg, dbscope.Options{Pool: pool, BatchLinger: 200 * time.Millisecond}, handler(true))
	if err != nil {
		t.Fatal(err)
	}
	stop1 := run(t, r1)
	headInRetryTopic(t, k, r1, topic)
	// k/1 parks behind A in the transaction that j/0's handler holds open.
	if err := k.Produce(ctx, idRecord(topic, "k", "k/1", "B"), idRecord(topic, "j", "j/0", "J0")); err != nil {
		t.Fatal(err)
	}
	var pid int32
	select {
	case pid = <-blocked:
	case <-time.After(time.Minute):
		t.Fatal("j/0's handler was not called")
	}
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	close(release)
	stop1() //nolint:errcheck // the first runner's end is the crash
	if err := k.Produce(ctx, idRecord(topic, "k", "k/2", "C")); err != nil {
		t.Fatal(err)
	}
	r2, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, handler(false))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r2, k, group, topic, "every record applied", time.Minute, func() bool {
		return countEffects(t, pool).unique == 4
	})
	order := effectOrder(t, pool)
	var ks []string
	for _, e := range order {
		if strings.HasPrefix(e, "k/") {
			ks = append(ks, e)
		}
	}
	if got := strings.Join(ks, ","); got != "k/0,k/1,k/2" {
		t.Fatalf("k's effects %s (all %v), want k/0,k/1,k/2", got, order)
	}
	if c := countEffects(t, pool); c.rows != 4 {
		t.Fatalf("effects %v: a record applied twice", order)
	}
}

// The records released from PostgreSQL behind a key's head are counted
// once each, and as what they were: a release transaction that a
// transient error rolls back and runs again does not count the records it
// applied before the error twice, and a business skip is counted as
// skipped. A is in the retry topics; B, C, D and E wait behind it. C's
// handler skips it; D's first release fails with a serialization
// failure, after B was applied in the same transaction. A fails again
// from its retry topic until all four wait behind it, however long the
// broker takes to deliver them.
func TestDBReleasedRecordsCountedOnce(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "payments", "g-release-counts"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Failures = orderedPolicy(2, 200)
	deliveries := &deliveryRecorder{}
	cfg.Hooks = []hook.Hook{deliveries}
	var aCalls, dCalls atomic.Int32
	var runner atomic.Pointer[dbscope.Runner]
	behind := func() bool { r := runner.Load(); return r != nil && r.Stats().DB.Parked >= 4 }
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			switch string(r.Value) {
			case "k/0":
				if aCalls.Add(1) == 1 || !behind() {
					return consumer.Retryable(errors.New("ledger service 503"))
				}
			case "k/2":
				return consumer.Skip(errors.New("order cancelled"))
			case "k/3":
				if dCalls.Add(1) == 1 {
					return fmt.Errorf("posting: %w", &pgconn.PgError{Code: "40001", Message: "could not serialize access"})
				}
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	runner.Store(r)
	stop := run(t, r)
	headInRetryTopic(t, k, r, topic)
	if err := k.Produce(ctx, idRecord(topic, "k", "k/1", "B"), idRecord(topic, "k", "k/2", "C"),
		idRecord(topic, "k", "k/3", "D"), idRecord(topic, "k", "k/4", "E")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "A, B, D and E applied", func() bool { return len(effectOrder(t, pool)) == 4 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(effectOrder(t, pool), ","); got != "k/0,k/1,k/3,k/4" {
		t.Fatalf("effects %s, want k/0,k/1,k/3,k/4", got)
	}
	st := r.Stats().DB
	aFailed := int64(aCalls.Load()) - 1
	if st.Parked != 4 || st.Applied != 4 || st.Skipped != 1 || st.Failed != aFailed {
		t.Fatalf("parked %d, applied %d, skipped %d, failed %d; want 4 parked (B, C, D, E), 4 applied (A, B, D, E), 1 skipped (C), "+
			"%d failed (A's deliveries before its last)", st.Parked, st.Applied, st.Skipped, st.Failed, aFailed)
	}
	if st.TxRetries < 1 {
		t.Fatalf("%d transactions retried; D's serialization failure should have retried one", st.TxRetries)
	}
	// Every handler call belongs to a delivery reported to the hooks
	// (one span each in kscopeotel, one count each in kscopeprom): a
	// released record's, which runs from PostgreSQL, too, once.
	want := "k/0: " + strings.Repeat("retried ", int(aFailed)) + "success; k/1: parked success; k/2: parked skipped; k/3: parked success; k/4: parked success"
	if got := deliveries.String(); got != want {
		t.Fatalf("deliveries %s, want %s", got, want)
	}
}

// deliveryRecorder records the outcomes of each record value's
// deliveries, in the order they end, and notes a delivery that ends
// without a start, or never ends.
type deliveryRecorder struct {
	mu    sync.Mutex
	open  map[string]int
	ended map[string][]string
}

type deliveryKey struct{}

func (d *deliveryRecorder) OnRecordStart(ctx context.Context, s hook.RecordStart) context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.open == nil {
		d.open, d.ended = map[string]int{}, map[string][]string{}
	}
	d.open[string(s.Record.Value)]++
	return context.WithValue(ctx, deliveryKey{}, string(s.Record.Value))
}

func (d *deliveryRecorder) OnRecordEnd(ctx context.Context, e hook.RecordEnd) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v := string(e.Record.Value)
	if ctx.Value(deliveryKey{}) != v || d.open[v] == 0 {
		d.ended[v] = append(d.ended[v], string(e.Outcome)+" (no start)")
		return
	}
	d.open[v]--
	d.ended[v] = append(d.ended[v], string(e.Outcome))
}

// String lists each value's outcomes ("v: o1 o2"), by value.
func (d *deliveryRecorder) String() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, v := range slices.Sorted(maps.Keys(d.ended)) {
		line := v + ": " + strings.Join(d.ended[v], " ")
		if n := d.open[v]; n > 0 {
			line += fmt.Sprintf(" (%d not ended)", n)
		}
		out = append(out, line)
	}
	return strings.Join(out, "; ")
}
