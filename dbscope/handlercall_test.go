package dbscope_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// insertValue records r's value as an effect (in the key column).
func insertValue(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, 0)`, consumer.Identity{}.Of(r), string(r.Value))
	return err
}

// produceTo creates a one-partition topic and produces recs to it.
func produceTo(t *testing.T, k *testenv.Kafka, topic string, recs ...*kgo.Record) {
	t.Helper()
	if err := k.CreateTopic(context.Background(), topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
}

// In the DB scope, Keep filters records out by header and by key and MaxAge
// skips an old record, before the handler and in their key's order: the
// kept records are applied in order, the others end filtered or expired,
// are counted, and their offsets are committed.
func TestDBKeepAndMaxAgeSkip(t *testing.T) {
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "db-keep", "g-db-keep"
	produceTo(t, k, topic,
		&kgo.Record{Topic: topic, Key: []byte("acct"), Value: []byte("a1")},
		&kgo.Record{Topic: topic, Key: []byte("acct"), Value: []byte("a2"), Headers: []kgo.RecordHeader{{Key: "drop", Value: []byte("1")}}},
		&kgo.Record{Topic: topic, Key: []byte("acct"), Value: []byte("old"), Timestamp: time.Now().Add(-time.Hour)},
		&kgo.Record{Topic: topic, Key: []byte("noise"), Value: []byte("n1")},
		&kgo.Record{Topic: topic, Key: []byte("acct"), Value: []byte("a3")},
	)
	outs := testenv.NewOutcomes()
	cfg := baseConfig(k, group, topic)
	cfg.Keep = func(r *consumer.Record) bool {
		_, drop := r.Header("drop")
		return !drop && string(r.Key) != "noise"
	}
	cfg.MaxAge, cfg.Expired = time.Minute, consumer.ExpiredSkip
	cfg.Hooks = []hook.Hook{outs}
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(insertValue))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every record done", time.Minute, func() bool { return r.Stats().Done == 5 })
	if got := strings.Join(effectKeys(t, pool), ","); got != "a1,a3" {
		t.Fatalf("applied %s; want a1,a3", got)
	}
	st := r.Stats()
	if st.Filtered != 2 || st.Expired != 1 || st.DB.Applied != 2 {
		t.Fatalf("Stats: Filtered %d, Expired %d, DB.Applied %d; want 2, 1, 2", st.Filtered, st.Expired, st.DB.Applied)
	}
	for v, want := range map[string]hook.Outcome{"a2": hook.OutcomeFiltered, "n1": hook.OutcomeFiltered, "old": hook.OutcomeExpired, "a3": hook.OutcomeSuccess} {
		if got := outs.Outcome(v); got != want {
			t.Errorf("%s ended %q; want %q", v, got, want)
		}
	}
}

// In the DB scope, an expired record goes to the DLT by default, with its
// failure metadata, and its key's next record is applied after it.
func TestDBMaxAgeDeadLetter(t *testing.T) {
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "db-age", "g-db-age"
	produceTo(t, k, topic,
		&kgo.Record{Topic: topic, Key: []byte("acct"), Value: []byte("old"), Timestamp: time.Now().Add(-time.Hour)},
		&kgo.Record{Topic: topic, Key: []byte("acct"), Value: []byte("fresh")},
	)
	outs := testenv.NewOutcomes()
	cfg := baseConfig(k, group, topic)
	cfg.MaxAge = time.Minute
	cfg.Hooks = []hook.Hook{outs}
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(insertValue))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "both records done", time.Minute, func() bool { return r.Stats().Done == 2 })
	if got := strings.Join(effectKeys(t, pool), ","); got != "fresh" {
		t.Fatalf("applied %s; want fresh only", got)
	}
	if st := r.Stats(); st.Expired != 1 || st.Failures.DeadLettered != 1 {
		t.Fatalf("Stats: Expired %d, DeadLettered %d; want 1, 1", st.Expired, st.Failures.DeadLettered)
	}
	if e, _ := outs.Last("old"); e.Outcome != hook.OutcomeDeadLettered || !errors.Is(e.Err, consumer.ErrExpired) {
		t.Fatalf("old ended %+v; want dead_lettered with ErrExpired", e)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || testenv.Header(dlt[0], retrytopic.HeaderErrorClass) != "terminal" || !strings.Contains(testenv.Header(dlt[0], retrytopic.HeaderError), "expired") {
		t.Fatalf("DLT %v; want the old record, class terminal, its error saying it expired", dlt)
	}
}

// In the DB scope, a handler that honours its context fails at
// HandlerTimeout as a retryable failure and is retried (an unknown error
// would go to the DLT at once here); one that ignores it past the grace is
// reported once, and its record is applied once it returns.
func TestDBHandlerTimeout(t *testing.T) {
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "db-timeout", "g-db-timeout"
	produceTo(t, k, topic,
		&kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("honours")},
		&kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("ignores")},
	)
	var honours atomic.Int64
	release := make(chan struct{})
	outs := testenv.NewOutcomes()
	cfg := baseConfig(k, group, topic)
	cfg.HandlerTimeout, cfg.HandlerGrace = 100*time.Millisecond, 50*time.Millisecond
	cfg.Failures.UnknownAttempts = 1
	cfg.Hooks = []hook.Hook{outs}
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		switch string(r.Value) {
		case "honours":
			if honours.Add(1) == 1 {
				<-ctx.Done()
				return ctx.Err()
			}
		case "ignores":
			<-release
		}
		return insertValue(context.WithoutCancel(ctx), tx, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "the overrun reported", func() bool { return r.Stats().HandlerOverruns == 1 })
	if !slices.Contains(outs.Events("ignores"), hook.EventHandlerOverrun) {
		t.Fatalf("events of the hung record %v; want %s", outs.Events("ignores"), hook.EventHandlerOverrun)
	}
	close(release)
	testenv.WaitFor(t, time.Minute, "both records done", func() bool { return r.Stats().Done == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := honours.Load(); n != 2 {
		t.Fatalf("the honouring handler ran %d times; want 2 (timed out, then retried)", n)
	}
	if got := strings.Join(effectKeys(t, pool), ","); got != "honours" && got != "honours,ignores" {
		t.Fatalf("applied %s; want honours (then ignores, if its statement ran in time)", got)
	}
	if st := r.Stats(); st.Failures.DeadLettered != 0 || st.HandlerOverruns != 1 {
		t.Fatalf("Stats: DeadLettered %d, HandlerOverruns %d; want 0, 1", st.Failures.DeadLettered, st.HandlerOverruns)
	}
}

// In the DB scope, middleware runs in order around the handler, inside the
// record's transaction: Recover inside a logging middleware lets it see a
// panic as an error (the record is dead-lettered, its writes rolled
// back), and Timeout's deadline makes a call fail as retryable.
func TestDBMiddleware(t *testing.T) {
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "db-mw", "g-db-mw"
	produceTo(t, k, topic,
		&kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("panics")},
		&kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("slow")},
	)
	var mu sync.Mutex
	seenErrs := map[string]error{}
	logging := func(next dbscope.Handler) dbscope.Handler {
		return dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			err := next.Handle(ctx, tx, r)
			mu.Lock()
			if _, ok := seenErrs[string(r.Value)]; !ok || err != nil {
				seenErrs[string(r.Value)] = err
			}
			mu.Unlock()
			return err
		})
	}
	var slow atomic.Int64
	h := dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		if err := insertValue(ctx, tx, r); err != nil {
			return err
		}
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
	cfg := baseConfig(k, group, topic)
	cfg.Failures.UnknownAttempts = 1
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.Chain(h, logging, dbscope.Recover(), dbscope.Timeout(100*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "both records done", time.Minute, func() bool { return r.Stats().Done == 2 })
	if got := strings.Join(effectKeys(t, pool), ","); got != "slow" {
		t.Fatalf("applied %s; want slow alone (the panic's writes rolled back)", got)
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
	if st := r.Stats(); st.Failures.DeadLettered != 1 {
		t.Fatalf("DeadLettered %d; want 1 (the panic)", st.Failures.DeadLettered)
	}
}

// A queued handler's chain runs in order too: RecoverQueue inside a
// logging middleware lets it see a panic as an error (what the call
// queued is not sent), TimeoutQueue's deadline makes a call fail as
// retryable.
func TestDBQueueMiddleware(t *testing.T) {
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "db-qmw", "g-db-qmw"
	produceTo(t, k, topic,
		&kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("panics")},
		&kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("slow")},
	)
	var mu sync.Mutex
	seenErrs := map[string]error{}
	logging := func(next dbscope.QueueHandler) dbscope.QueueHandler {
		return dbscope.QueueFunc(func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
			err := next.Queue(ctx, q, r)
			mu.Lock()
			if _, ok := seenErrs[string(r.Value)]; !ok || err != nil {
				seenErrs[string(r.Value)] = err
			}
			mu.Unlock()
			return err
		})
	}
	var slow atomic.Int64
	qh := dbscope.QueueFunc(func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
		q.Exec(`INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, 0)`, consumer.Identity{}.Of(r), string(r.Value))
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
	cfg := baseConfig(k, group, topic)
	cfg.Failures.UnknownAttempts = 1
	r, err := dbscope.NewQueued(cfg, dbscope.Options{Pool: pool}, dbscope.ChainQueue(qh, logging, dbscope.RecoverQueue(), dbscope.TimeoutQueue(100*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "both records done", time.Minute, func() bool { return r.Stats().Done == 2 })
	if got := strings.Join(effectKeys(t, pool), ","); got != "slow" {
		t.Fatalf("applied %s; want slow alone (the panicking call's statements not sent)", got)
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
	if st := r.Stats(); st.Failures.DeadLettered != 1 {
		t.Fatalf("DeadLettered %d; want 1 (the panic)", st.Failures.DeadLettered)
	}
}
