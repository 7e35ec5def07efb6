package dbscope_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/partition"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// callCounter counts handler calls per record value.
type callCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callCounter) add(r *consumer.Record) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[string(r.Value)]++
	return c.n[string(r.Value)]
}

// repeats returns the values handled more than once, but for those in
// except, with their call counts.
func (c *callCounter) repeats(except ...string) map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for v, n := range c.n {
		if n > 1 && !contains(except, v) {
			out[v] = n
		}
	}
	return out
}

func (c *callCounter) of(v string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[v]
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// produceValues produces one record per value "key/n" (key "null" makes a
// null-key record) to partition 0 of topic, in order.
func produceValues(t testing.TB, k *testenv.Kafka, topic string, vals ...string) {
	t.Helper()
	var recs []*kgo.Record
	for _, v := range vals {
		key, _, _ := strings.Cut(v, "/")
		r := &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(v)}
		if key == "null" {
			r.Key = nil
		}
		recs = append(recs, r)
	}
	if err := k.Produce(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
}

// Versions need per-key order, which an Unordered policy gives up: the DB
// scope refuses the combination at construction, in the words the Kafka
// scope uses.
func TestVersionsWithUnorderedFailuresRejected(t *testing.T) {
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"},
		Failures: retrytopic.Policy{Unordered: true}}
	pool, err := pgxpool.New(context.Background(), "postgres://localhost:1/unused")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = dbscope.New(cfg, dbscope.Options{Pool: pool, Versions: &sequence.Config{}}, dbscope.HandlerFunc(insertEffect))
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Versions" {
		t.Fatalf("Versions with Failures.Unordered: got %v, want a ConfigError naming Versions", err)
	}
	_, terr := txn.New(cfg, txn.Options{TransactionalID: "t-1", Versions: &sequence.Config{}}, txn.HandlerFunc(
		func(context.Context, *consumer.Record, txn.Emitter) error { return nil }))
	var tce *consumer.ConfigError
	if !errors.As(terr, &tce) || tce.Reason != ce.Reason {
		t.Fatalf("the DB scope says %q, the Kafka scope %v: want the same reason", ce.Reason, terr)
	}
	if _, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(insertEffect)); err != nil {
		t.Fatalf("Unordered without versions: %v", err)
	}
}

// Run refuses to start on a database that dbscope.Migrate has not set up
// (or not brought up to date), with an error that says to run it with the
// scope's table prefix, instead of retrying every batch forever.
func TestRunWithoutMigrateFails(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic = "unmigrated"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	produceValues(t, k, topic, "a/0", "b/0")
	for _, tc := range []struct {
		name    string
		prepare func(*pgxpool.Pool) error
	}{
		{"no tables", func(*pgxpool.Pool) error { return nil }},
		{"an older schema", func(pool *pgxpool.Pool) error {
			if err := dbscope.Migrate(ctx, pool, "shop_"); err != nil {
				return err
			}
			_, err := pool.Exec(ctx, `DELETE FROM shop_schema_migrations WHERE version = (SELECT max(version) FROM shop_schema_migrations)`)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := pgxpool.New(ctx, testenv.DatabaseT(t))
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if err := tc.prepare(pool); err != nil {
				t.Fatal(err)
			}
			group := "g-unmigrated-" + strings.ReplaceAll(tc.name, " ", "-")
			r, err := dbscope.New(baseConfig(k, group, topic), dbscope.Options{Pool: pool, TablePrefix: "shop_"}, dbscope.HandlerFunc(insertEffect))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()
			var runErr error
			select {
			case runErr = <-errc:
			case <-time.After(20 * time.Second):
				cancel()
				<-errc
				t.Fatalf("Run still running after 20s on an unmigrated database (%d transaction retries)", r.Stats().DB.TxRetries)
			}
			if runErr == nil || !strings.Contains(runErr.Error(), `dbscope.Migrate`) || !strings.Contains(runErr.Error(), `"shop_"`) {
				t.Fatalf("Run returned %v, want an error saying to run dbscope.Migrate with prefix \"shop_\"", runErr)
			}
			if st := r.Stats(); st.Done != 0 {
				t.Fatalf("%d records done on an unmigrated database", st.Done)
			}
		})
	}
}

// Positions stored in the database under one routing of records to
// key-shards are not used under another: null-key records that failed
// under NullKeyOrdered, on one shard, are all applied by a second run
// under NullKeySpread, although the other shards' stored positions lie
// beyond them.
func TestStoredOffsetsIgnoreAnotherRouting(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "routing", "g-routing"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var vals []string
	for i := range 20 {
		vals = append(vals, fmt.Sprintf("null/%d", i))
	}
	// The keyed records avoid the null-key records' shard: under the
	// first routing they are applied whatever the fetch boundaries, while
	// the null-key records keep failing ahead of them on their own shard.
	nullShard := partition.Shard(topic, 0, 0, nil, 8, partition.NullKeyOrdered)
	for i := 0; len(vals) < 60; i++ {
		key := fmt.Sprintf("k%d", i)
		if partition.Shard(topic, 0, 0, []byte(key), 8, partition.NullKeyOrdered) != nullShard {
			vals = append(vals, key+"/0")
		}
	}
	produceValues(t, k, topic, vals...)
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 8
	opts := dbscope.Options{Pool: pool, StoreOffsets: true}
	first, err := dbscope.New(cfg, opts, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		if r.Key == nil {
			return consumer.Retryable(errors.New("ledger unavailable"))
		}
		return insertEffect(ctx, tx, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, first)
	testenv.WaitFor(t, time.Minute, "the keyed records applied, the null-key ones failing", func() bool {
		return first.Stats().DB.Applied == 40 && first.Stats().DB.Failed > 0
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	cfg.NullKeys = consumer.NullKeySpread
	second, err := dbscope.New(cfg, opts, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, second, k, group, topic, "every record done", time.Minute, func() bool { return second.Stats().Done >= int64(len(vals)) })
	var nulls int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE key = 'null'`).Scan(&nulls); err != nil {
		t.Fatal(err)
	}
	if c := countEffects(t, pool); nulls != 20 || c.rows != len(vals) || c.unique != len(vals) {
		t.Fatalf("%d of 20 null-key records applied (effects %+v, second run %+v): stored positions skipped records never applied",
			nulls, c, second.Stats().DB)
	}
}

// netError is a network error of the handler's own (an HTTP call, say).
type netError struct{}

func (netError) Error() string   { return "dial tcp 10.0.0.7:443: i/o timeout" }
func (netError) Timeout() bool   { return true }
func (netError) Temporary() bool { return true }

var _ net.Error = netError{}

// Handler errors that wrap io.EOF, io.ErrUnexpectedEOF or a net.Error, or
// read like a dropped connection, are not PostgreSQL's: they follow the
// failure policy (a decode error to the DLT at once, an unknown error its
// in-place budget, then the DLT) instead of retrying the batch forever.
func TestHandlerNetworkErrorsFollowThePolicy(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "handler-errors", "g-handler-errors"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	produceValues(t, k, topic, "a/0", "truncated/0", "b/0", "eof/0", "c/0", "net/0", "d/0", "reset/0", "e/0")
	fails := map[string]error{
		"truncated": consumer.DecodeError(fmt.Errorf("decoding the body: %w", io.ErrUnexpectedEOF)),
		"eof":       fmt.Errorf("calling the gateway: %w", io.EOF),
		"net":       fmt.Errorf("calling the gateway: %w", netError{}),
		"reset":     errors.New("calling the gateway: read: connection reset by peer"),
	}
	var calls callCounter
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1
	cfg.Failures.UnknownAttempts = 2
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		calls.add(r)
		if err := insertEffect(ctx, tx, r); err != nil {
			return err
		}
		return fails[string(r.Key)]
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, 30*time.Second, "the failing records dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 4 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantOutcomes(t, r, 5, 0, 4)
	if got := strings.Join(effectKeys(t, pool), ","); got != "a,b,c,d,e" {
		t.Fatalf("effects %s, want a,b,c,d,e", got)
	}
	for v, want := range map[string]int{"truncated/0": 1, "eof/0": 2, "net/0": 2, "reset/0": 2} {
		if got := calls.of(v); got != want {
			t.Errorf("%s handled %d times, want %d", v, got, want)
		}
	}
	if st := r.Stats().DB; st.TxRetries != 0 {
		t.Fatalf("%d transactions retried as if PostgreSQL had failed", st.TxRetries)
	}
}

// A handler whose statement fails and which goes on (returns a business
// skip, or ignores the error and returns nil) leaves the transaction
// aborted. Its record is rolled back to its savepoint and routed — the
// skip acknowledged without its writes, the nil treated as a failure — and
// the rest of the batch commits.
func TestAbortedTransactionIsolatesItsRecord(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE amounts (message_id text PRIMARY KEY, amount int NOT NULL CHECK (amount >= 0))`); err != nil {
		t.Fatal(err)
	}
	const topic, group = "aborted", "g-aborted"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	produceValues(t, k, topic, "a/0", "declined/0", "b/0", "ignored/0", "c/0")
	var calls callCounter
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1
	cfg.Failures.UnknownAttempts = 2
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		calls.add(r)
		if err := insertEffect(ctx, tx, r); err != nil {
			return err
		}
		switch string(r.Key) {
		case "declined":
			if _, err := tx.Exec(ctx, `INSERT INTO amounts VALUES ($1, -1)`, string(r.Value)); err != nil {
				return consumer.Skip(fmt.Errorf("card declined: %w", err))
			}
		case "ignored":
			tx.Exec(ctx, `INSERT INTO amounts VALUES ($1, -1)`, string(r.Value)) //nolint:errcheck // the handler bug under test
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, 30*time.Second, "every record done", func() bool { return r.Stats().Done == 5 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantOutcomes(t, r, 3, 1, 1)
	if got := strings.Join(effectKeys(t, pool), ","); got != "a,b,c" {
		t.Fatalf("effects %s, want a,b,c: the aborted records' writes rolled back, the others committed", got)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || string(dlt[0].Value) != "ignored/0" || !strings.Contains(testenv.Header(dlt[0], retrytopic.HeaderError), "aborted") {
		t.Fatalf("DLT %v: want ignored/0 with an error saying its transaction was aborted", dlt)
	}
	if rep := calls.repeats("ignored/0"); len(rep) > 0 {
		t.Fatalf("records handled again: %v", rep)
	}
}

// A record that fails in a batch does not make the handlers of the records
// before it in the batch run again: they commit on their first call, for a
// Handler that wrote before failing, one whose statement failed, one whose
// statement timed out (a transient error), and for a QueueHandler whose
// statement failed or which failed itself.
func TestFailingRecordDoesNotRerunEarlierRecords(t *testing.T) {
	const failing = "k07/0"
	type handlers struct {
		h  dbscope.HandlerFunc
		qh dbscope.QueueFunc
	}
	amounts := `INSERT INTO amounts VALUES ($1, $2)`
	cases := []struct {
		name string
		make func(calls *callCounter, pool *pgxpool.Pool) handlers
		dlt  int
	}{
		{"Handler wrote then failed", func(calls *callCounter, _ *pgxpool.Pool) handlers {
			return handlers{h: func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
				calls.add(r)
				if err := insertEffect(ctx, tx, r); err != nil {
					return err
				}
				if string(r.Value) == failing {
					return consumer.Terminal(errors.New("refused"))
				}
				return nil
			}}
		}, 1},
		{"Handler statement failed", func(calls *callCounter, _ *pgxpool.Pool) handlers {
			return handlers{h: func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
				calls.add(r)
				if err := insertEffect(ctx, tx, r); err != nil {
					return err
				}
				amount := 1
				if string(r.Value) == failing {
					amount = -1
				}
				_, err := tx.Exec(ctx, amounts, string(r.Value), amount)
				return err
			}}
		}, 1},
		{"Handler statement timed out", func(calls *callCounter, pool *pgxpool.Pool) handlers {
			if _, err := pool.Exec(context.Background(), `CREATE SEQUENCE slow`); err != nil {
				panic(err)
			}
			return handlers{h: func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
				calls.add(r)
				if err := insertEffect(ctx, tx, r); err != nil {
					return err
				}
				if string(r.Value) == failing {
					for _, s := range []string{`SET LOCAL statement_timeout = '50ms'`,
						`SELECT CASE WHEN nextval('slow') = 1 THEN pg_sleep(2) END`, `SET LOCAL statement_timeout = 0`} {
						if _, err := tx.Exec(ctx, s); err != nil {
							return err
						}
					}
				}
				return nil
			}}
		}, 0},
		{"QueueHandler statement failed", func(calls *callCounter, _ *pgxpool.Pool) handlers {
			return handlers{qh: func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
				calls.add(r)
				amount := 1
				if string(r.Value) == failing {
					amount = -1
				}
				q.Exec(amounts, string(r.Value), amount)
				return queueEffect(ctx, q, r)
			}}
		}, 1},
		{"QueueHandler failed", func(calls *callCounter, _ *pgxpool.Pool) handlers {
			return handlers{qh: func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
				calls.add(r)
				if err := queueEffect(ctx, q, r); err != nil {
					return err
				}
				if string(r.Value) == failing {
					return consumer.Terminal(errors.New("refused"))
				}
				return nil
			}}
		}, 1},
	}
	for n, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			k := testenv.KafkaT(t)
			pool := newPool(t)
			if _, err := pool.Exec(ctx, `CREATE TABLE amounts (message_id text PRIMARY KEY, amount int NOT NULL CHECK (amount >= 0))`); err != nil {
				t.Fatal(err)
			}
			topic, group := fmt.Sprintf("rerun-%d", n), fmt.Sprintf("g-rerun-%d", n)
			if err := k.CreateTopic(ctx, topic, 1); err != nil {
				t.Fatal(err)
			}
			var vals []string
			for i := range 20 {
				vals = append(vals, fmt.Sprintf("k%02d/0", i))
			}
			produceValues(t, k, topic, vals...)
			var calls callCounter
			hs := tc.make(&calls, pool)
			cfg := baseConfig(k, group, topic)
			cfg.Shards = 1 // the records share batches
			cfg.Failures.UnknownAttempts = 2
			var qh dbscope.QueueHandler
			if hs.qh != nil {
				qh = hs.qh
			}
			r := newEither(t, cfg, dbscope.Options{Pool: pool}, hs.h, qh)
			runToEnd(t, r, k, group, topic, "every record done", time.Minute, func() bool { return r.Stats().Done == int64(len(vals)) })
			if rep := calls.repeats(failing); len(rep) > 0 {
				t.Fatalf("records before or after the failing one handled again: %v", rep)
			}
			if got := r.Stats().Failures.DeadLettered; got != int64(tc.dlt) {
				t.Fatalf("%d records dead-lettered, want %d", got, tc.dlt)
			}
			if c := countEffects(t, pool); c.rows != len(vals)-tc.dlt || c.unique != c.rows {
				t.Fatalf("effects %+v, want %d", c, len(vals)-tc.dlt)
			}
		})
	}
}

// An offsets table from before stored positions named their routing keeps
// working after dbscope.Migrate: its rows are not used, new ones are.
func TestMigrateUpgradesStoredOffsets(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "upgrade", "g-upgrade"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	// The table as an earlier version left it, with a position far ahead.
	for _, q := range []string{
		`ALTER TABLE kscope_offsets DROP COLUMN routing`,
		`DELETE FROM kscope_schema_migrations WHERE version = 5`,
		`INSERT INTO kscope_offsets (consumer, topic, partition, shard, shards, next_offset) VALUES ('g-upgrade', 'upgrade', 0, 0, 1, 1000)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	produceValues(t, k, topic, "a/0", "b/0", "c/0")
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool, StoreOffsets: true}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every record applied", time.Minute, func() bool { return r.Stats().DB.Applied == 3 })
	var next int64
	if err := pool.QueryRow(ctx, `SELECT next_offset FROM kscope_offsets WHERE consumer = $1 AND routing <> ''`, group).Scan(&next); err != nil {
		t.Fatal(err)
	}
	if next != 3 {
		t.Fatalf("stored position %d after 3 records, want 3", next)
	}
}

// A batch with more writing records than one transaction takes savepoints
// for commits in several transactions: every record once, a failing one
// late in the batch rolled back alone.
func TestLargeBatchOfWritingRecords(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "large-batch", "g-large-batch"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var vals []string
	for i := range 200 {
		vals = append(vals, fmt.Sprintf("k%03d/0", i))
	}
	produceValues(t, k, topic, vals...)
	const failing = "k150/0"
	var calls callCounter
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		calls.add(r)
		if err := insertEffect(ctx, tx, r); err != nil {
			return err
		}
		if string(r.Value) == failing {
			return consumer.Terminal(errors.New("refused"))
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every record done", time.Minute, func() bool { return r.Stats().Done == int64(len(vals)) })
	if rep := calls.repeats(); len(rep) > 0 {
		t.Fatalf("records handled again: %v", rep)
	}
	wantOutcomes(t, r, 199, 0, 1)
	if c := countEffects(t, pool); c.rows != 199 || c.unique != 199 {
		t.Fatalf("effects %+v, want 199", c)
	}
	wantKeyOrder(t, pool)
}

// A handler that hangs inside its batch's transaction (a call with no
// timeout) is named by the stall watch: the record whose handler has not
// returned, not the first record of the batch, whose handler returned long
// ago but whose done waits for the transaction. Once it returns, the batch
// commits, every record once.
func TestHungHandlerInATransactionIsNamed(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "stall", "g-stall"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	produceValues(t, k, topic, "a/0", "b/0", "hangs/0", "c/0")
	release := make(chan struct{})
	defer close(release)
	var logs testenv.LogBuffer
	stalls := &testenv.Stalls{}
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1
	cfg.StallWarning = 300 * time.Millisecond
	cfg.Logger = logs.Logger()
	cfg.Hooks = []hook.Hook{stalls}
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		if string(r.Key) == "hangs" {
			<-release // ignores its context
		}
		return insertEffect(ctx, tx, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "the stall reported", func() bool { return len(stalls.All()) > 0 })
	if got := stalls.All()[0]; got.Ended || got.Offset != 2 || got.Topic != topic {
		t.Fatalf("stall reported as %+v; want %s[0]@2, the record whose handler hangs", got, topic)
	}
	if !strings.Contains(logs.String(), "its handler has not returned;") || !strings.Contains(logs.String(), "key=hangs") {
		t.Fatalf("no WARN says the handler of key hangs has not returned:\n%s", logs.String())
	}
	if n := r.Stats().StalledShards; n != 1 {
		t.Fatalf("Stats().StalledShards = %d; want 1", n)
	}
	release <- struct{}{}
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == 4 })
	testenv.WaitFor(t, time.Minute, "the stall's end reported", func() bool { return len(stalls.All()) == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(effectKeys(t, pool), ","); got != "a,b,hangs,c" {
		t.Fatalf("effects %s; want a,b,hangs,c", got)
	}
	if n := r.Stats().StalledShards; n != 0 {
		t.Fatalf("Stats().StalledShards = %d after the stall ended; want 0", n)
	}
}

// A handler whose SQL would end the batch's transaction itself (a script
// with its own COMMIT or ROLLBACK, run through tx.Exec, a nested
// transaction, or queued) does not take the other records of its batch
// with it: a ROLLBACK undid their effects and inbox rows while their
// offsets committed, and a COMMIT made the inbox rows of the records after
// it durable before their handlers ran (a crash then, and they counted as
// done). The statement is not sent; the record fails as terminal (to the
// DLT, with an error that says why), and the other records of its batch
// apply, each once.
func TestHandlerEndingTheTransactionFailsAlone(t *testing.T) {
	type way struct {
		name string
		h    dbscope.Handler
		qh   dbscope.QueueHandler
	}
	write := func(sql string) dbscope.Handler {
		return dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if err := insertEffect(ctx, tx, r); err != nil {
				return err
			}
			if string(r.Key) == "ends" {
				_, err := tx.Exec(ctx, sql)
				return err
			}
			return nil
		})
	}
	ways := []way{
		{name: "rollback", h: write("ROLLBACK")},
		{name: "commit", h: write("commit")},
		{name: "script", h: write("UPDATE effects SET seq = seq WHERE key = 'none'; /* done */ END;")},
		{name: "nested", h: dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if err := insertEffect(ctx, tx, r); err != nil {
				return err
			}
			if string(r.Key) != "ends" {
				return nil
			}
			n, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			_, err = n.Exec(ctx, "ROLLBACK")
			return err
		})},
		{name: "queued", qh: dbscope.QueueFunc(func(_ context.Context, q *dbscope.Queue, r *consumer.Record) error {
			key, seq, _ := testenv.ParseKeyed(r.Value)
			q.Exec(`INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`, consumer.Identity{}.Of(r), key, seq)
			if key == "ends" {
				q.Exec("COMMIT")
			}
			return nil
		})},
	}
	for _, w := range ways {
		t.Run(w.name, func(t *testing.T) {
			ctx := context.Background()
			k := testenv.KafkaT(t)
			pool := newPool(t)
			topic, group := "ends-"+w.name, "g-ends-"+w.name
			if err := k.CreateTopic(ctx, topic, 1); err != nil {
				t.Fatal(err)
			}
			produceValues(t, k, topic, "a/0", "b/0", "ends/0", "c/0", "d/0")
			cfg := baseConfig(k, group, topic)
			cfg.Shards = 1
			r := newEither(t, cfg, dbscope.Options{Pool: pool}, w.h, w.qh)
			stop := run(t, r)
			testenv.WaitFor(t, 30*time.Second, "every record done", func() bool { return r.Stats().Done == 5 })
			testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(effectKeys(t, pool), ","); got != "a,b,c,d" {
				t.Fatalf("effects %s; want a,b,c,d", got)
			}
			dlt := k.ReadAll(t, retrytopic.DLTopic(group))
			if len(dlt) != 1 || string(dlt[0].Value) != "ends/0" || !strings.Contains(testenv.Header(dlt[0], retrytopic.HeaderError), "would end the transaction") ||
				testenv.Header(dlt[0], retrytopic.HeaderErrorClass) != "terminal" {
				t.Fatalf("DLT %v: want ends/0, terminal, with an error saying its SQL would end the transaction", dlt)
			}
		})
	}
}
