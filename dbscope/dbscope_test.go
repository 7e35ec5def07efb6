package dbscope_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/sequence"
)

// The same message produced twice (one message-id) has one effect; the
// second delivery is counted as a duplicate and never reaches the handler.
func TestDuplicateDeliveryHasOneEffect(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic = "payments"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 10 {
		id := []kgo.RecordHeader{{Key: "message-id", Value: []byte(fmt.Sprintf("pi_%d", i))}}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("acct"), Value: []byte(fmt.Sprintf("acct/%d", i)), Headers: id})
	}
	// pi_3 and pi_7 are produced again later: a producer retry, a replay.
	recs = append(recs, recs[3], recs[7])
	for _, r := range recs {
		if err := k.Produce(ctx, &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers}); err != nil {
			t.Fatal(err)
		}
	}
	var calls atomic.Int64
	r, err := dbscope.New(baseConfig(k, "g-dup", topic), dbscope.Options{Pool: pool},
		dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			calls.Add(1)
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, "g-dup", topic, "all deliveries done", time.Minute, func() bool { return r.Stats().Done >= 12 })
	if c := countEffects(t, pool); c.rows != 10 || c.unique != 10 {
		t.Fatalf("effects %+v, want 10 rows for 10 unique messages", c)
	}
	if st := r.Stats().DB; st.Duplicates != 2 || st.Applied != 10 || calls.Load() != 10 {
		t.Fatalf("stats %+v, handler calls %d: want 10 applied, 2 duplicates, 10 calls", st, calls.Load())
	}
}

// Resetting the group and consuming the topic again applies nothing: every
// record is a duplicate, the effects are unchanged.
func TestReplayIsANoOp(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "replay", "g-replay"
	if err := k.CreateTopic(ctx, topic, 3); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, topic, 30, 20)
	opts := dbscope.Options{Pool: pool, Consumer: "ledger"}
	first, err := dbscope.New(baseConfig(k, group, topic), opts, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, first)
	testenv.WaitFor(t, time.Minute, "first pass", func() bool { return first.Stats().DB.Applied == int64(total) })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Reset the group to the start of the topic.
	if _, err := k.Admin().DeleteGroup(ctx, group); err != nil {
		t.Fatal(err)
	}
	second, err := dbscope.New(baseConfig(k, group, topic), opts, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop = run(t, second)
	testenv.WaitFor(t, time.Minute, "the replay", func() bool { return second.Stats().Done == int64(total) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := second.Stats().DB; st.Duplicates != int64(total) || st.Applied != 0 {
		t.Fatalf("replay stats %+v: want all %d records duplicates, none applied", st, total)
	}
	if c := countEffects(t, pool); c.rows != total || c.unique != total {
		t.Fatalf("effects %+v after the replay, want %d", c, total)
	}
}

// One failing record in a batch: the others commit, the failing one's
// partial effect is rolled back to its savepoint, the committed offset stays
// below it, and once it succeeds it is applied once.
func TestBatchPartialFailure(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "batch", "g-batch"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	// Fewer records than a batch holds: the failing record's neighbours
	// share its transaction. (Records queued behind a batch wait for its
	// failing record's in-place retries: the shard is serial.)
	const total = 60
	var recs []*kgo.Record
	for i := range total {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("k%d/0", i))})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	const poison = "k57"
	var healed atomic.Bool
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1 // one queue: the records batch up behind each other
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool, BatchSize: 64}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if err := insertEffect(ctx, tx, r); err != nil {
				return err
			}
			if string(r.Key) == poison && !healed.Load() {
				return consumer.Retryable(errors.New("gateway said no")) // after a write: the savepoint must undo it
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "every other record applied", func() bool { return r.Stats().DB.Applied == total-1 })
	testenv.WaitFor(t, time.Minute, "the failure retried", func() bool { return r.Stats().DB.Failed >= 2 })
	var poisonRows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE key = $1`, poison).Scan(&poisonRows); err != nil {
		t.Fatal(err)
	}
	if poisonRows != 0 {
		t.Fatalf("the failing record's write survived its rollback: %d rows", poisonRows)
	}
	com, err := k.CommittedOffsets(ctx, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	if com[0] > 57 {
		t.Fatalf("committed offset %d passes the failing record at offset 57", com[0])
	}
	if st := r.Stats().DB; st.Transactions >= total {
		t.Fatalf("%d transactions for %d records: records were not batched", st.Transactions, total)
	}
	healed.Store(true)
	testenv.WaitFor(t, time.Minute, "the failing record applied", func() bool { return r.Stats().DB.Applied == total })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if c := countEffects(t, pool); c.rows != total || c.unique != total {
		t.Fatalf("effects %+v, want %d", c, total)
	}
}

// A record that fails keeps the later records of its key waiting behind it,
// while other keys of the same shard go on.
func TestFailureHoldsItsKeyOnly(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "holdkey", "g-holdkey"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	k.ProduceKeyed(t, topic, 4, 10)
	var failures atomic.Int64
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if string(r.Value) == "k001/3" && failures.Add(1) <= 3 {
				return consumer.Retryable(errors.New("transient business failure"))
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "every record applied", func() bool { return r.Stats().DB.Applied == 40 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT key, seq FROM effects ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	order := []string{}
	for rows.Next() {
		var key string
		var seq int
		rows.Scan(&key, &seq)
		if prev, ok := last[key]; ok && seq != prev+1 || !ok && seq != 0 {
			t.Fatalf("key %s applied %d after %d: per-key order broken", key, seq, prev)
		}
		last[key] = seq
		order = append(order, fmt.Sprintf("%s/%d", key, seq))
	}
	rows.Close()
	// Other keys did not wait for k001: k000's last record landed before
	// k001's failed record did.
	pos := func(s string) int {
		for i, v := range order {
			if v == s {
				return i
			}
		}
		return -1
	}
	if pos("k000/9") > pos("k001/3") {
		t.Fatalf("k000 waited for k001's failing record: %s", strings.Join(order, " "))
	}
}

// Options that cannot work fail at construction, each with its field named.
func TestBadOptions(t *testing.T) {
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}}
	h := dbscope.HandlerFunc(insertEffect)
	pool := newPool(t)
	cases := []struct {
		o     dbscope.Options
		field string
	}{
		{dbscope.Options{}, "Pool"},
		{dbscope.Options{Pool: pool, TablePrefix: "x; DROP TABLE users; --"}, "TablePrefix"},
		{dbscope.Options{Pool: pool, TablePrefix: "Upper"}, "TablePrefix"},
		{dbscope.Options{Pool: pool, BatchSize: -1}, "BatchSize"},
		{dbscope.Options{Pool: pool, BatchLinger: -time.Second}, "BatchLinger"},
		{dbscope.Options{Pool: pool, InboxTTL: -time.Hour}, "InboxTTL"},
		{dbscope.Options{Pool: pool, CleanupBatch: -3}, "CleanupBatch"},
		{dbscope.Options{Pool: pool, StartTimeout: -time.Second}, "StartTimeout"},
		{dbscope.Options{Pool: pool, CleanupInterval: -time.Minute}, "CleanupInterval"},
		{dbscope.Options{Pool: pool, TablePrefix: strings.Repeat("a", 41)}, "TablePrefix"},
		{dbscope.Options{Pool: pool, Versions: &sequence.Config{Gaps: 9}}, "Versions"},
		{dbscope.Options{Pool: pool, Versions: &sequence.Config{First: 5}}, "Versions"},
		{dbscope.Options{Pool: pool, Versions: &sequence.Config{GapTimeout: -time.Second}}, "Versions"},
	}
	// Every message says what to change, not only what is wrong.
	says := regexp.MustCompile(`; (set|use|pass)|must be|use `)
	for _, tc := range cases {
		_, err := dbscope.New(cfg, tc.o, h)
		var ce *consumer.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), "dbscope.Options."+tc.field) {
			t.Errorf("options %+v: got %v, want an error naming %s", tc.o, err, tc.field)
		} else if !says.MatchString(err.Error()) {
			t.Errorf("error %q does not say what to change", err)
		}
	}
	if _, err := dbscope.New(consumer.Config{}, dbscope.Options{}, h); err == nil ||
		!strings.Contains(err.Error(), "Config.Brokers") || !strings.Contains(err.Error(), "Options.Pool") {
		t.Errorf("a config and options both wrong: %v, want both named", err)
	}
	if _, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, nil); err == nil {
		t.Error("nil handler accepted")
	}
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t) // migrated once already
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- dbscope.Migrate(ctx, pool, "") }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := dbscope.Migrate(ctx, pool, "other_"); err != nil {
		t.Fatal(err)
	}
	var n int
	pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_name IN ('kscope_inbox','other_inbox','kscope_offsets','other_offsets')`).Scan(&n)
	if n != 4 {
		t.Fatalf("found %d of the 4 tables", n)
	}
	if err := dbscope.Migrate(ctx, pool, "bad-prefix"); err == nil || !strings.Contains(err.Error(), "plain identifier") {
		t.Fatalf("bad prefix: %v", err)
	}
}

func TestCleanupInboxDeletesOldRowsInBatches(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	if _, err := pool.Exec(ctx, `INSERT INTO kscope_inbox (consumer, message_id, processed_at)
		SELECT 'c', 'old-' || g, now() - interval '2 days' FROM generate_series(1, 2500) g
		UNION ALL SELECT 'c', 'new-' || g, now() FROM generate_series(1, 10) g
		UNION ALL SELECT 'other', 'old-' || g, now() - interval '2 days' FROM generate_series(1, 5) g`); err != nil {
		t.Fatal(err)
	}
	n, err := dbscope.CleanupInbox(ctx, pool, dbscope.CleanupOptions{Consumer: "c", TTL: 24 * time.Hour, Batch: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if n != 2500 {
		t.Fatalf("deleted %d, want the 2500 old rows of consumer c", n)
	}
	var left int
	pool.QueryRow(ctx, `SELECT count(*) FROM kscope_inbox`).Scan(&left)
	if left != 15 {
		t.Fatalf("%d rows left, want the 10 new ones and the other consumer's 5", left)
	}
}

// With Options.InboxTTL the runner itself deletes expired inbox rows while
// it runs.
func TestRunnerCleansUpExpiredInboxRows(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "ttl", "g-ttl"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO kscope_inbox (consumer, message_id, processed_at)
		SELECT $1, 'expired-' || g, now() - interval '2 hours' FROM generate_series(1, 50) g`, group); err != nil {
		t.Fatal(err)
	}
	r, err := dbscope.New(baseConfig(k, group, topic), dbscope.Options{
		Pool: pool, InboxTTL: time.Hour, CleanupInterval: 20 * time.Millisecond, CleanupBatch: 7,
	}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "expired inbox rows deleted", func() bool {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM kscope_inbox`).Scan(&n)
		return n == 0
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// An input written by a transactional producer: the DB scope applies the
// committed records once, none of the aborted ones, and commits its offsets
// past the transactions' markers, so the group shows no lag, also after a
// transaction that aborts once it caught up; a restarted runner resumes
// there and applies only what came after.
func TestTransactionalInputCommittedPastMarkers(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "tx-orders", "g-tx-orders"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	opts := dbscope.Options{Pool: pool, Consumer: "ledger"}
	everyThird := func(x int) bool { return x%3 == 2 }
	total := len(k.ProduceInTransactions(t, "upstream-1", topic, 2, 6, 5, everyThird))
	first, err := dbscope.New(baseConfig(k, group, topic), opts, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, first)
	testenv.WaitFor(t, time.Minute, "the first transactions applied", func() bool { return first.Stats().DB.Applied == int64(total) })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	// A transaction that aborts once the runner caught up reaches it as
	// markers alone: the committed offsets pass them too.
	k.ProduceInTransactions(t, "upstream-1", topic, 2, 1, 5, func(int) bool { return true })
	testenv.WaitFor(t, 30*time.Second, "offsets committed past the aborted transaction's markers", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	total += len(k.ProduceInTransactions(t, "upstream-2", topic, 2, 3, 4, everyThird))
	second, err := dbscope.New(baseConfig(k, group, topic), opts, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, second, k, group, topic, "the later transactions applied", time.Minute, func() bool {
		return first.Stats().DB.Applied+second.Stats().DB.Applied == int64(total)
	})
	if st := second.Stats().DB; st.Duplicates != 0 {
		t.Fatalf("the restarted runner met %d duplicates: it did not resume past the first run's markers", st.Duplicates)
	}
	if c := countEffects(t, pool); c.rows != total || c.unique != total {
		t.Fatalf("effects %+v, want %d committed records once each", c, total)
	}
}
