package dbscope_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
)

// copyEffects writes the effects of recs with one COPY.
func copyEffects(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"effects"}, []string{"message_id", "key", "seq"},
		pgx.CopyFromSlice(len(recs), func(i int) ([]any, error) {
			key, seq, _ := testenv.ParseKeyed(recs[i].Value)
			return []any{consumer.Identity{}.Of(recs[i]), key, seq}, nil
		}))
	return err
}

// A batch handler that writes its records with one COPY applies each
// record once: duplicates (a message id produced twice) are left out
// before it, its calls take many records, and per-key order holds.
func TestBatchHandlerCopiesEachRecordOnce(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "batched", "g-batched"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	const total = 300
	var recs []*kgo.Record
	for i := range total {
		id := []kgo.RecordHeader{{Key: "message-id", Value: fmt.Appendf(nil, "m%d", i)}}
		recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%7), Value: fmt.Appendf(nil, "k%d/%d", i%7, i/7), Headers: id})
	}
	recs = append(recs, recs[10], recs[200]) // produced again
	for _, r := range recs {
		r2 := *r
		if err := k.Produce(ctx, &r2); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	calls, largest := 0, 0
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 2
	r, err := dbscope.NewBatch(cfg, dbscope.Options{Pool: pool}, dbscope.BatchHandlerFunc(
		func(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
			mu.Lock()
			calls += len(recs)
			largest = max(largest, len(recs))
			mu.Unlock()
			return copyEffects(ctx, tx, recs)
		}))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every delivery done", time.Minute, func() bool { return r.Stats().Done == total+2 })
	if c := countEffects(t, pool); c.rows != total || c.unique != total {
		t.Fatalf("effects %+v, want %d rows for %d messages", c, total, total)
	}
	st := r.Stats().DB
	if st.Applied != total || st.Duplicates != 2 || calls != total {
		t.Fatalf("stats %+v, records handed to the handler %d: want %d applied, 2 duplicates, %d handed", st, calls, total, total)
	}
	if largest < 2 {
		t.Fatal("no call took more than one record")
	}
	wantKeyOrder(t, pool)
}

// batchFaults is a batch handler that writes with COPY and fails records
// by their value: "a/2" is poison (FailedAt, terminal), "b/2" fails twice
// as retryable (FailedAt), "c/2" makes its first call fail with a plain
// error and "d/2" its first call panic.
type batchFaults struct {
	mu    sync.Mutex
	seen  map[string]int
	sizes []int
}

func (h *batchFaults) HandleBatch(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
	if err := copyEffects(ctx, tx, recs); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sizes = append(h.sizes, len(recs))
	for i, r := range recs {
		v := string(r.Value)
		h.seen[v]++ // calls that reached the record
		switch {
		case v == "a/2":
			return consumer.FailedAt(i, consumer.DecodeError(errors.New("not JSON")))
		case v == "b/2" && h.seen[v] < 3:
			return consumer.FailedAt(i, consumer.Retryable(errors.New("gateway 503")))
		case v == "c/2" && h.seen[v] == 1:
			return errors.New("the batch's call broke")
		case v == "d/2" && h.seen[v] == 1:
			panic("a bad record")
		}
	}
	return nil
}

// A failing record of a batch handler is rolled back and routed alone:
// the poison record goes to the DLT and the flaky one is retried in place
// (its handler given it alone), while the other records commit once and
// the records of their keys after them wait for them. A plain error and a
// panic run the batch again one record at a time. Each record applies
// once, in per-key order.
func TestBatchHandlerFailureIsolatesTheRecord(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "batched-faults", "g-batched-faults"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for seq := 1; seq <= 3; seq++ {
		for _, key := range []string{"a", "b", "c", "d", "e"} {
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: fmt.Appendf(nil, "%s/%d", key, seq)})
		}
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	h := &batchFaults{seen: map[string]int{}}
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1
	cfg.Failures.DisableRetryTopics = true
	r, err := dbscope.NewBatch(cfg, dbscope.Options{Pool: pool}, h)
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every record done", time.Minute, func() bool { return r.Stats().Done == int64(len(recs)) })
	wantOutcomes(t, r, int64(len(recs)-1), 0, 1)
	if c := countEffects(t, pool); c.rows != len(recs)-1 || c.unique != len(recs)-1 {
		t.Fatalf("effects %+v, want %d rows, one per applied record", c, len(recs)-1)
	}
	wantKeyOrder(t, pool)
	got := effectOrder(t, pool)
	if slices.Contains(got, "a/2") {
		t.Fatalf("the poison record's effect committed: %v", got)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || string(dlt[0].Value) != "a/2" {
		t.Fatalf("DLT holds %d records, want a/2 alone", len(dlt))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !slices.ContainsFunc(h.sizes, func(n int) bool { return n > 1 }) || !slices.Contains(h.sizes, 1) {
		t.Fatalf("call sizes %v: want batches and one-record calls", h.sizes)
	}
}

func TestNewBatchRefusesANilHandler(t *testing.T) {
	_, err := dbscope.NewBatch(consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}}, dbscope.Options{}, nil)
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("NewBatch(nil) = %v, want a *consumer.ConfigError", err)
	}
}

// With versions, a batch handler's calls take no two records of one key:
// in-order versions of several keys apply, in order, in calls that still
// take several keys' records; a repeated or older version is stale.
func TestBatchHandlerWithVersions(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "acct-batched", "g-versions-batched"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for v := 1; v <= 3; v++ {
		for _, key := range []string{"K", "L", "M"} {
			recs = append(recs, versioned(topic, key, v, 0))
		}
	}
	recs = append(recs, versioned(topic, "K", 3, 1), versioned(topic, "L", 1, 1)) // the same version again, an older one
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var calls [][]string
	cfg := versionConfig(k, group, topic)
	cfg.Shards = 1
	r, err := dbscope.NewBatch(cfg, dbscope.Options{Pool: pool, Versions: &sequence.Config{}},
		dbscope.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
			var keys []string
			for _, r := range recs {
				keys = append(keys, string(r.Key))
			}
			mu.Lock()
			calls = append(calls, keys)
			mu.Unlock()
			return copyEffects(ctx, tx, recs)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == int64(len(recs)) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got := appliedVersions(t, pool)
	for _, key := range []string{"K", "L", "M"} {
		if got[key] != "1,2,3" {
			t.Fatalf("key %s applied versions %s, want 1,2,3", key, got[key])
		}
	}
	if st := r.Stats().DB; st.Stale != 2 || st.Applied != 9 {
		t.Fatalf("stats %+v: want 9 applied, 2 stale", st)
	}
	mu.Lock()
	defer mu.Unlock()
	several := false
	for _, c := range calls {
		several = several || len(c) > 1
		seen := map[string]bool{}
		for _, key := range c {
			if seen[key] {
				t.Fatalf("a call took two records of key %s: %v", key, calls)
			}
			seen[key] = true
		}
	}
	if !several {
		t.Fatalf("no call took more than one record: %v", calls)
	}
}

// A transient error from a batch handler, returned as it is or through
// FailedAt, retries the transaction after a backoff: nothing is routed to
// the DLT and every record applies once.
func TestBatchHandlerTransientErrorRetriesTheTransaction(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "batched-transient", "g-batched-transient"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 12 {
		recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%4), Value: fmt.Appendf(nil, "k%d/%d", i%4, i/4)})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls := 0
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1
	r, err := dbscope.NewBatch(cfg, dbscope.Options{Pool: pool}, dbscope.BatchHandlerFunc(
		func(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			switch n {
			case 1:
				return &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
			case 2:
				return consumer.FailedAt(len(recs)-1, &pgconn.PgError{Code: "40001", Message: "could not serialize access"})
			}
			return copyEffects(ctx, tx, recs)
		}))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every record done", time.Minute, func() bool { return r.Stats().Done == int64(len(recs)) })
	wantOutcomes(t, r, int64(len(recs)), 0, 0)
	if c := countEffects(t, pool); c.rows != len(recs) || c.unique != len(recs) {
		t.Fatalf("effects %+v, want %d rows, one per record", c, len(recs))
	}
	wantKeyOrder(t, pool)
}

// A record a batch handler fails with FailedAt goes to a retry topic with
// its key parked: the later records of its key wait in PostgreSQL and are
// applied after it, in order (released through the batch handler, one at a
// time), while the other keys' records commit at once.
func TestBatchHandlerFailureParksTheKey(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "batched-parked", "g-batched-parked"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for seq := 1; seq <= 3; seq++ {
		for _, key := range []string{"a", "b", "c"} {
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: fmt.Appendf(nil, "%s/%d", key, seq)})
		}
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	failed := false
	cfg := versionConfig(k, group, topic) // one attempt in place, then the retry topics
	cfg.Shards = 1
	r, err := dbscope.NewBatch(cfg, dbscope.Options{Pool: pool}, dbscope.BatchHandlerFunc(
		func(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
			mu.Lock()
			defer mu.Unlock()
			for i, r := range recs {
				if string(r.Value) == "b/1" && !failed {
					failed = true
					return consumer.FailedAt(i, consumer.Retryable(errors.New("gateway 503")))
				}
			}
			return copyEffects(ctx, tx, recs)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "every record applied", func() bool { return countEffects(t, pool).rows == len(recs) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if c := countEffects(t, pool); c.rows != len(recs) || c.unique != len(recs) {
		t.Fatalf("effects %+v, want %d rows, one per record", c, len(recs))
	}
	wantKeyOrder(t, pool)
	if st := r.Stats().DB; st.Parked == 0 {
		t.Fatalf("stats %+v: b/2 and b/3 did not wait behind b/1", st)
	}
}

// Records Config.Keep filters out never reach a DB-scope batch handler:
// they are done, skipped, in the transaction of the records around them,
// which apply once.
func TestBatchHandlerSeesOnlyAdmittedRecords(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "batched-keep", "g-batched-keep"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 12 {
		recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%3), Value: fmt.Appendf(nil, "k%d/%d", i%3, i/3)})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1
	cfg.Keep = func(r *consumer.Record) bool { return !strings.HasPrefix(string(r.Value), "k1/") }
	var mu sync.Mutex
	saw := false
	r, err := dbscope.NewBatch(cfg, dbscope.Options{Pool: pool}, dbscope.BatchHandlerFunc(
		func(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
			for _, r := range recs {
				if strings.HasPrefix(string(r.Value), "k1/") {
					mu.Lock()
					saw = true
					mu.Unlock()
				}
			}
			return copyEffects(ctx, tx, recs)
		}))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every record done", time.Minute, func() bool { return r.Stats().Done == int64(len(recs)) })
	mu.Lock()
	defer mu.Unlock()
	if saw {
		t.Fatal("the batch handler was given a record Keep filtered out")
	}
	if c := countEffects(t, pool); c.rows != 8 || c.unique != 8 {
		t.Fatalf("effects %+v, want the 8 admitted records once each", c)
	}
	wantKeyOrder(t, pool)
}
