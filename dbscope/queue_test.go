package dbscope_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// queueEffect is insertEffect's queued form.
func queueEffect(_ context.Context, q *dbscope.Queue, r *consumer.Record) error {
	key, seq, _ := testenv.ParseKeyed(r.Value)
	q.Exec(`INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`, consumer.Identity{}.Of(r), key, seq)
	return nil
}

// A queued handler's statements commit with the inbox rows of their batch:
// every record once, duplicates (one message-id produced twice) skipped
// before the handler, records batched many to a transaction.
func TestQueuedHandlerAppliesEachRecordOnce(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "queued", "g-queued"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	const total = 300
	var recs []*kgo.Record
	for i := range total {
		id := []kgo.RecordHeader{{Key: "message-id", Value: []byte(fmt.Sprintf("m%d", i))}}
		recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%7), Value: fmt.Appendf(nil, "k%d/%d", i%7, i/7), Headers: id})
	}
	recs = append(recs, recs[10], recs[200]) // produced again
	for _, r := range recs {
		r2 := *r
		if err := k.Produce(ctx, &r2); err != nil {
			t.Fatal(err)
		}
	}
	var calls atomic.Int64
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 2
	r, err := dbscope.NewQueued(cfg, dbscope.Options{Pool: pool}, dbscope.QueueFunc(
		func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
			calls.Add(1)
			return queueEffect(ctx, q, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every delivery done", time.Minute, func() bool { return r.Stats().Done == total+2 })
	if c := countEffects(t, pool); c.rows != total || c.unique != total {
		t.Fatalf("effects %+v, want %d rows for %d messages", c, total, total)
	}
	st := r.Stats().DB
	if st.Applied != total || st.Duplicates != 2 || calls.Load() != total {
		t.Fatalf("stats %+v, handler calls %d: want %d applied, 2 duplicates, %d calls", st, calls.Load(), total, total)
	}
	if st.Transactions >= total/2 {
		t.Fatalf("%d transactions for %d records: the records were not batched", st.Transactions, total)
	}
	wantKeyOrder(t, pool)
}

// A queued statement that fails (here a CHECK constraint) fails its record
// alone: the record's statements are rolled back, the rest of its batch
// commits, and once its budget is spent it goes to the dead-letter topic
// with the statement's error. A handler's own error and a business skip
// behave as they do for a Handler: the skip keeps what it queued.
func TestQueuedStatementFailureIsolatesItsRecord(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE amounts (message_id text PRIMARY KEY, amount int NOT NULL CHECK (amount >= 0))`); err != nil {
		t.Fatal(err)
	}
	const topic, group = "queued-fail", "g-queued-fail"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	// value "key/amount"; a negative amount breaks the CHECK constraint.
	vals := []string{"a/1", "b/2", "negative/-5", "c/3", "undecodable/x", "declined/7", "d/4", "negative/6"}
	var recs []*kgo.Record
	for _, v := range vals {
		key, _, _ := strings.Cut(v, "/")
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(v)})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls := map[string]int{}
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1 // one queue: the records share batches
	cfg.Failures.UnknownAttempts = 2
	r, err := dbscope.NewQueued(cfg, dbscope.Options{Pool: pool}, dbscope.QueueFunc(
		func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
			mu.Lock()
			calls[string(r.Value)]++
			mu.Unlock()
			key, amount, _ := strings.Cut(string(r.Value), "/")
			id := consumer.Identity{}.Of(r)
			q.Exec(`INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, 0)`, id, key)
			var n int
			if _, err := fmt.Sscan(amount, &n); err != nil {
				return consumer.DecodeError(fmt.Errorf("amount %q is not a number", amount))
			}
			q.Exec(`INSERT INTO amounts (message_id, amount) VALUES ($1, $2)`, id, n)
			if key == "declined" {
				return consumer.Skip(errors.New("card declined"))
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every record done", time.Minute, func() bool { return r.Stats().Done == int64(len(vals)) })
	wantOutcomes(t, r, 5, 1, 2)
	keys := effectKeys(t, pool)
	if got := strings.Join(keys, ","); got != "a,b,c,declined,d,negative" {
		t.Fatalf("effects %s: want a,b,c,declined,d,negative (the failing records' statements rolled back, the skip's kept)", got)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 2 {
		t.Fatalf("DLT holds %d records, want 2", len(dlt))
	}
	byValue := map[string]*kgo.Record{}
	for _, d := range dlt {
		byValue[string(d.Value)] = d
	}
	neg, und := byValue["negative/-5"], byValue["undecodable/x"]
	if neg == nil || und == nil {
		t.Fatalf("DLT %v: want negative/-5 and undecodable/x", dlt)
	}
	if e := testenv.Header(neg, retrytopic.HeaderError); !strings.Contains(e, "amounts_amount_check") {
		t.Fatalf("the failing statement's record carries error %q, want the CHECK violation", e)
	}
	if c := testenv.Header(und, retrytopic.HeaderErrorClass); c != "terminal" {
		t.Fatalf("the undecodable record's class is %q, want terminal", c)
	}
	if a := testenv.Header(neg, retrytopic.HeaderAttempt); a != "2" {
		t.Fatalf("the failing statement's record was dead-lettered after %s attempts, want its budget of 2", a)
	}
	// No handler runs twice for one attempt: the transaction that runs
	// again without the failing statement's record sends the statements
	// the others queued. Only the failing statement's record is called
	// again, once per attempt of its budget.
	mu.Lock()
	defer mu.Unlock()
	for v, n := range calls {
		if want := map[bool]int{true: 2, false: 1}[v == "negative/-5"]; n != want {
			t.Fatalf("handler calls %v: want 2 for negative/-5 and 1 for the others", calls)
		}
	}
}

// A connection killed while a batch's statements are in flight retries the
// batch: nothing is lost and nothing applies twice.
func TestQueuedBatchSurvivesConnectionLoss(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "queued-conn", "g-queued-conn"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, topic, 40, 10)
	var killed atomic.Int64
	r, err := dbscope.NewQueued(baseConfig(k, group, topic), dbscope.Options{Pool: pool}, dbscope.QueueFunc(
		func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
			if err := queueEffect(ctx, q, r); err != nil {
				return err
			}
			if r.Offset%37 == 5 && killed.Load() < 3 {
				// Ends this connection's backend when the batch is sent,
				// after the inbox rows and some effects.
				killed.Add(1)
				q.Exec(`SELECT pg_terminate_backend(pg_backend_pid())`)
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every record applied", 2*time.Minute, func() bool { return r.Stats().DB.Applied == int64(total) })
	if killed.Load() == 0 || r.Stats().DB.TxRetries == 0 {
		t.Fatalf("no connection was killed (%d) or no transaction retried (%+v)", killed.Load(), r.Stats().DB)
	}
	if c := countEffects(t, pool); c.rows != total || c.unique != total {
		t.Fatalf("effects %+v, want %d", c, total)
	}
}

func TestNewQueuedRejectsANilHandler(t *testing.T) {
	_, err := dbscope.NewQueued(consumer.Config{Brokers: []string{"x:9092"}, Group: "g", Topics: []string{"t"}}, dbscope.Options{}, nil)
	if err == nil || !strings.Contains(err.Error(), "dbscope.NewQueued's handler: is nil") {
		t.Fatalf("err %v, want a ConfigError naming the Handler", err)
	}
}
