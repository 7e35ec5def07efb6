package txn_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/txn"
)

// echoToOut emits each input's value to "out".
func echoToOut(_ context.Context, r *consumer.Record, out txn.Emitter) error {
	out.Emit(&kgo.Record{Topic: "out", Key: r.Key, Value: r.Value})
	return nil
}

// outputs returns the committed outputs' values, in order.
func outputs(t *testing.T, k *testenv.Kafka) string {
	var vs []string
	for _, r := range k.ReadAll(t, "out") {
		vs = append(vs, string(r.Value))
	}
	return strings.Join(vs, ",")
}

// In the Kafka scope, Keep filters records out by header and by key and
// MaxAge skips an old record, before the handler and in their key's
// order: the kept records' outputs commit in order, the others end
// filtered or expired, are counted, and their offsets commit in the
// transactions.
func TestKafkaKeepAndMaxAgeSkip(t *testing.T) {
	k := setup(t)
	ctx := context.Background()
	if err := k.Produce(ctx,
		&kgo.Record{Topic: "in", Key: []byte("acct"), Value: []byte("a1")},
		&kgo.Record{Topic: "in", Key: []byte("acct"), Value: []byte("a2"), Headers: []kgo.RecordHeader{{Key: "drop", Value: []byte("1")}}},
		&kgo.Record{Topic: "in", Key: []byte("acct"), Value: []byte("old"), Timestamp: time.Now().Add(-time.Hour)},
		&kgo.Record{Topic: "in", Key: []byte("noise"), Value: []byte("n1")},
		&kgo.Record{Topic: "in", Key: []byte("acct"), Value: []byte("a3")},
	); err != nil {
		t.Fatal(err)
	}
	outs := testenv.NewOutcomes()
	cfg := config(k, "g-kafka-keep")
	cfg.Keep = func(r *consumer.Record) bool {
		_, drop := r.Header("drop")
		return !drop && string(r.Key) != "noise"
	}
	cfg.MaxAge, cfg.Expired = time.Minute, consumer.ExpiredSkip
	cfg.Hooks = []hook.Hook{outs}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "keep"}, txn.HandlerFunc(echoToOut))
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == 5 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, "g-kafka-keep", "in") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := outputs(t, k); got != "a1,a3" {
		t.Fatalf("outputs %s; want a1,a3", got)
	}
	if st := r.Stats(); st.Filtered != 2 || st.Expired != 1 || st.Kafka.Records != 5 {
		t.Fatalf("Stats: Filtered %d, Expired %d, Kafka.Records %d; want 2, 1, 5", st.Filtered, st.Expired, st.Kafka.Records)
	}
	for v, want := range map[string]hook.Outcome{"a2": hook.OutcomeFiltered, "n1": hook.OutcomeFiltered, "old": hook.OutcomeExpired, "a3": hook.OutcomeSuccess} {
		if e, _ := outs.Last(v); e.Outcome != want || (want != hook.OutcomeSuccess && e.Err == nil) {
			t.Errorf("%s ended %+v; want %q with the rule's error", v, e, want)
		}
	}
}

// In the Kafka scope, an expired record goes to the DLT by default, inside
// the transaction, with its failure metadata.
func TestKafkaMaxAgeDeadLetter(t *testing.T) {
	k := setup(t)
	if err := k.Produce(context.Background(),
		&kgo.Record{Topic: "in", Key: []byte("acct"), Value: []byte("old"), Timestamp: time.Now().Add(-time.Hour)},
		&kgo.Record{Topic: "in", Key: []byte("acct"), Value: []byte("fresh")},
	); err != nil {
		t.Fatal(err)
	}
	outs := testenv.NewOutcomes()
	cfg := config(k, "g-kafka-age")
	cfg.MaxAge = time.Minute
	cfg.Hooks = []hook.Hook{outs}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "age"}, txn.HandlerFunc(echoToOut))
	if err != nil {
		t.Fatal(err)
	}
	runFor(t, r)
	testenv.WaitFor(t, time.Minute, "both records done", func() bool { return r.Stats().Done == 2 })
	if got := outputs(t, k); got != "fresh" {
		t.Fatalf("outputs %s; want fresh", got)
	}
	if st := r.Stats(); st.Expired != 1 || st.Kafka.DeadLettered != 1 {
		t.Fatalf("Stats: Expired %d, Kafka.DeadLettered %d; want 1, 1", st.Expired, st.Kafka.DeadLettered)
	}
	if e, _ := outs.Last("old"); e.Outcome != hook.OutcomeDeadLettered || !errors.Is(e.Err, consumer.ErrExpired) {
		t.Fatalf("old ended %+v; want dead_lettered with ErrExpired", e)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic("g-kafka-age"))
	if len(dlt) != 1 || testenv.Header(dlt[0], retrytopic.HeaderErrorClass) != "terminal" || !strings.Contains(testenv.Header(dlt[0], retrytopic.HeaderError), "expired") {
		t.Fatalf("DLT %v; want the old record, class terminal, its error saying it expired", dlt)
	}
}

// In the Kafka scope, a handler that honours its context fails at
// HandlerTimeout as a retryable failure and is retried (an unknown error
// would go to the DLT at once here); one that ignores it past the grace
// is reported once, and its outputs commit once it returns.
func TestKafkaHandlerTimeout(t *testing.T) {
	k := setup(t)
	if err := k.Produce(context.Background(),
		&kgo.Record{Topic: "in", Key: []byte("a"), Value: []byte("honours")},
		&kgo.Record{Topic: "in", Key: []byte("a"), Value: []byte("ignores")},
	); err != nil {
		t.Fatal(err)
	}
	var honours atomic.Int64
	release := make(chan struct{})
	outs := testenv.NewOutcomes()
	cfg := config(k, "g-kafka-timeout")
	cfg.HandlerTimeout, cfg.HandlerGrace = 100*time.Millisecond, 50*time.Millisecond
	cfg.Failures.UnknownAttempts = 1
	cfg.Hooks = []hook.Hook{outs}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "timeout"}, txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
		switch string(r.Value) {
		case "honours":
			if honours.Add(1) == 1 {
				<-ctx.Done()
				return ctx.Err()
			}
		case "ignores":
			<-release
		}
		return echoToOut(ctx, r, out)
	}))
	if err != nil {
		t.Fatal(err)
	}
	runFor(t, r)
	testenv.WaitFor(t, time.Minute, "the overrun reported", func() bool { return r.Stats().HandlerOverruns == 1 })
	if !slices.Contains(outs.Events("ignores"), hook.EventHandlerOverrun) {
		t.Fatalf("events of the hung record %v; want %s", outs.Events("ignores"), hook.EventHandlerOverrun)
	}
	close(release)
	testenv.WaitFor(t, time.Minute, "both records done", func() bool { return r.Stats().Done == 2 })
	if n := honours.Load(); n != 2 {
		t.Fatalf("the honouring handler ran %d times; want 2 (timed out, then retried)", n)
	}
	if got := outputs(t, k); got != "honours,ignores" {
		t.Fatalf("outputs %s; want honours,ignores", got)
	}
	if st := r.Stats(); st.Kafka.DeadLettered != 0 || st.HandlerOverruns != 1 {
		t.Fatalf("Stats: DeadLettered %d, HandlerOverruns %d; want 0, 1", st.Kafka.DeadLettered, st.HandlerOverruns)
	}
}

// In the Kafka scope, Recover inside a logging middleware lets it see a
// panic as an error (the record is dead-lettered, what it emitted
// dropped), and Timeout's deadline makes a call fail as retryable.
func TestKafkaMiddleware(t *testing.T) {
	k := setup(t)
	if err := k.Produce(context.Background(),
		&kgo.Record{Topic: "in", Key: []byte("k"), Value: []byte("panics")},
		&kgo.Record{Topic: "in", Key: []byte("k"), Value: []byte("slow")},
	); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seenErrs := map[string]error{}
	logging := func(next txn.Handler) txn.Handler {
		return txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
			err := next.Handle(ctx, r, out)
			mu.Lock()
			if _, ok := seenErrs[string(r.Value)]; !ok || err != nil {
				seenErrs[string(r.Value)] = err
			}
			mu.Unlock()
			return err
		})
	}
	var slow atomic.Int64
	h := txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
		_ = echoToOut(ctx, r, out)
		switch string(r.Value) {
		case "panics":
			panic("boom")
		case "slow":
			if slow.Add(1) == 1 {
				<-ctx.Done()
				return ctx.Err()
			}
		}
		return nil
	})
	cfg := config(k, "g-kafka-mw")
	cfg.Failures.UnknownAttempts = 1
	r, err := txn.New(cfg, txn.Options{TransactionalID: "mw"}, txn.Chain(h, logging, txn.Recover(), txn.Timeout(100*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	runFor(t, r)
	testenv.WaitFor(t, time.Minute, "both records done", func() bool { return r.Stats().Done == 2 })
	if got := outputs(t, k); got != "slow" {
		t.Fatalf("outputs %s; want slow alone (the panicking call's output dropped)", got)
	}
	mu.Lock()
	perr, serr := seenErrs["panics"], seenErrs["slow"]
	mu.Unlock()
	if perr == nil || !strings.Contains(perr.Error(), "boom") {
		t.Fatalf("the logging middleware saw %v for the panic; want an error naming it", perr)
	}
	if !errors.Is(serr, consumer.ErrHandlerTimeout) || consumer.ClassOf(serr) != consumer.ClassRetryable {
		t.Fatalf("the timed-out call failed with %v; want ErrHandlerTimeout, of class retryable", serr)
	}
	if st := r.Stats(); st.Kafka.DeadLettered != 1 {
		t.Fatalf("Kafka.DeadLettered %d; want 1 (the panic)", st.Kafka.DeadLettered)
	}
}
