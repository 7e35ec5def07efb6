package dbscope_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// dltByValue reads the group's dead-letter topic, by record value.
func dltByValue(t *testing.T, k *testenv.Kafka, group string) map[string]*kgo.Record {
	t.Helper()
	out := map[string]*kgo.Record{}
	for _, d := range k.ReadAll(t, retrytopic.DLTopic(group)) {
		if out[string(d.Value)] != nil {
			t.Fatalf("%s dead-lettered twice", d.Value)
		}
		out[string(d.Value)] = d
	}
	return out
}

// wantDeadLetter fails the test unless d is a dead letter whose failure
// metadata names the class, the attempt count and an error containing
// errPart.
func wantDeadLetter(t *testing.T, d *kgo.Record, class consumer.Class, attempt, errPart string) {
	t.Helper()
	if d == nil {
		t.Fatal("the failing record is not in the DLT")
	}
	if c := testenv.Header(d, retrytopic.HeaderErrorClass); c != class.String() {
		t.Fatalf("%s: class %q, want %q", d.Value, c, class)
	}
	if a := testenv.Header(d, retrytopic.HeaderAttempt); a != attempt {
		t.Fatalf("%s: dead-lettered after %s attempts, want %s", d.Value, a, attempt)
	}
	if e := testenv.Header(d, retrytopic.HeaderError); !strings.Contains(e, errPart) {
		t.Fatalf("%s: error %q, want it to name %q", d.Value, e, errPart)
	}
}

// wantEffectsOnce fails the test unless the effects are those of keys,
// each applied once.
func wantEffectsOnce(t *testing.T, got []string, keys string) {
	t.Helper()
	if strings.Join(got, ",") != keys {
		t.Fatalf("effects %v, want %s, each once", got, keys)
	}
}

// A record whose first statement PostgreSQL cannot prepare (a table that
// does not exist, a syntax error) fails alone, as any failing statement
// does, when its error is classified as the record's fault (here a table
// named by the record; unclassified, such an error holds the pipeline:
// TestMissingTableHoldsThePipeline): it is routed by its class (a
// Terminal error to the DLT at once, one Policy.Classify calls unknown
// after its budget), and the other records of its batch commit, each
// once, with their offsets.
func TestUnpreparableFirstStatementFailsOnlyItsRecord(t *testing.T) {
	cases := []struct {
		name string
		make func(calls *callCounter) (dbscope.Handler, dbscope.QueueHandler)
	}{
		{"Handler", func(calls *callCounter) (dbscope.Handler, dbscope.QueueHandler) {
			return dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
				calls.add(r)
				switch string(r.Key) {
				case "unknown-tenant":
					if _, err := tx.Exec(ctx, `INSERT INTO ledger_of_unknown_tenant (message_id) VALUES ($1)`, string(r.Value)); err != nil {
						return consumer.Terminal(err)
					}
				case "typo":
					if _, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq) VALUS ($1, 'typo', 0)`, string(r.Value)); err != nil {
						return err
					}
				}
				return insertEffect(ctx, tx, r)
			}), nil
		}},
		{"QueueHandler", func(calls *callCounter) (dbscope.Handler, dbscope.QueueHandler) {
			return nil, dbscope.QueueFunc(func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
				calls.add(r)
				switch string(r.Key) {
				case "unknown-tenant":
					q.Exec(`INSERT INTO ledger_of_unknown_tenant (message_id) VALUES ($1)`, string(r.Value))
				case "typo":
					q.Exec(`INSERT INTO effects (message_id, key, seq) VALUS ($1, 'typo', 0)`, string(r.Value))
				}
				return queueEffect(ctx, q, r)
			})
		}},
	}
	for n, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			k := testenv.KafkaT(t)
			pool := newPool(t)
			topic, group := fmt.Sprintf("tenants-%d", n), fmt.Sprintf("g-unpreparable-%d", n)
			if err := k.CreateTopic(ctx, topic, 1); err != nil {
				t.Fatal(err)
			}
			vals := []string{"a/0", "unknown-tenant/0", "b/0", "typo/0", "c/0"}
			produceValues(t, k, topic, vals...)
			var calls callCounter
			h, qh := tc.make(&calls)
			cfg := baseConfig(k, group, topic)
			cfg.Shards = 1 // the records share batches
			cfg.Failures.UnknownAttempts = 2
			cfg.Failures.Classify = recordsFault
			var r *dbscope.Runner
			var err error
			if qh != nil {
				r, err = dbscope.NewQueued(cfg, dbscope.Options{Pool: pool}, qh)
			} else {
				r, err = dbscope.New(cfg, dbscope.Options{Pool: pool}, h)
			}
			if err != nil {
				t.Fatal(err)
			}
			runToEnd(t, r, k, group, topic, "every record done", time.Minute, func() bool { return r.Stats().Done == int64(len(vals)) })
			wantOutcomes(t, r, 3, 0, 2)
			wantEffectsOnce(t, effectKeys(t, pool), "a,b,c")
			dlt := dltByValue(t, k, group)
			if len(dlt) != 2 {
				t.Fatalf("DLT holds %d records, want unknown-tenant/0 and typo/0", len(dlt))
			}
			if qh == nil {
				wantDeadLetter(t, dlt["unknown-tenant/0"], consumer.ClassTerminal, "1", "does not exist")
			} else {
				wantDeadLetter(t, dlt["unknown-tenant/0"], consumer.ClassUnknown, "2", "does not exist")
			}
			wantDeadLetter(t, dlt["typo/0"], consumer.ClassUnknown, "2", "syntax error")
			if rep := calls.repeats("unknown-tenant/0", "typo/0"); qh != nil && len(rep) > 0 {
				t.Fatalf("queued handlers called again: %v", rep)
			}
		})
	}
}

// A record released from the waiting table whose first statement
// PostgreSQL cannot prepare fails alone: it is dead-lettered as its
// Terminal error says, and the record of its key waiting behind it is
// applied after it.
func TestReleasedRecordWithUnpreparableStatementIsDeadLettered(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "tenants", "g-release-unpreparable"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Failures = retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		InPlaceAttempts: 1, Ladder: []time.Duration{100 * time.Millisecond}, RetryableAttempts: 1000}
	var open atomic.Bool
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			switch string(r.Value) {
			case "K/0":
				if !open.Load() {
					return consumer.Retryable(errors.New("ledger 503"))
				}
			case "K/1":
				if _, err := tx.Exec(ctx, `INSERT INTO ledger_of_unknown_tenant (message_id) VALUES ($1)`, string(r.Value)); err != nil {
					return consumer.Terminal(err)
				}
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("K"), Value: []byte("K/0")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "K/0 in the retry topics", func() bool { return r.Stats().Failures.RetryTopic >= 1 })
	if err := k.Produce(ctx,
		&kgo.Record{Topic: topic, Key: []byte("K"), Value: []byte("K/1")},
		&kgo.Record{Topic: topic, Key: []byte("K"), Value: []byte("K/2")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "K/1 and K/2 waiting", func() bool { return r.Stats().DB.Parked >= 2 })
	open.Store(true)
	testenv.WaitFor(t, time.Minute, "K/1 dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 1 })
	testenv.WaitFor(t, time.Minute, "K/0 and K/2 applied", func() bool { return countEffects(t, pool).unique == 2 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(effectOrder(t, pool), ","); got != "K/0,K/2" {
		t.Fatalf("effects %s, want K/0,K/2, each once, in order", got)
	}
	dlt := dltByValue(t, k, group)
	if len(dlt) != 1 {
		t.Fatalf("DLT holds %d records, want K/1", len(dlt))
	}
	wantDeadLetter(t, dlt["K/1"], consumer.ClassTerminal, "1", "does not exist")
	var parked, waiting int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM kscope_parked), (SELECT count(*) FROM kscope_waiting)`).Scan(&parked, &waiting); err != nil {
		t.Fatal(err)
	}
	if parked != 0 || waiting != 0 {
		t.Fatalf("%d parked and %d waiting rows left", parked, waiting)
	}
}

// A record whose write breaks a deferred constraint (checked only at
// COMMIT) fails alone, with the constraint's error, as if its statement
// had failed: it is routed by the failure policy (here to the DLT once its
// budget of 2 is spent), and the other records of its batch commit, each
// once, with their offsets.
func TestDeferredConstraintViolationFailsOnlyItsRecord(t *testing.T) {
	const posting = `INSERT INTO postings VALUES ($1, $2)`
	cases := []struct {
		name string
		h    dbscope.Handler
		qh   dbscope.QueueHandler
	}{
		{name: "Handler", h: dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if _, err := tx.Exec(ctx, posting, string(r.Value), string(r.Key)); err != nil {
				return err
			}
			return insertEffect(ctx, tx, r)
		})},
		{name: "QueueHandler", qh: dbscope.QueueFunc(func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
			q.Exec(posting, string(r.Value), string(r.Key))
			return queueEffect(ctx, q, r)
		})},
	}
	// The deferred checks: a foreign key, and a constraint trigger that
	// raises its own error (SQLSTATE P0001, outside class 23).
	kinds := []struct{ name, ddl, errPart string }{
		{"foreign-key", `CREATE TABLE accounts (id text PRIMARY KEY);
			CREATE TABLE postings (message_id text PRIMARY KEY,
				account text NOT NULL REFERENCES accounts DEFERRABLE INITIALLY DEFERRED);
			INSERT INTO accounts VALUES ('a'), ('b'), ('c'), ('d'), ('e')`, "postings_account_fkey"},
		{"constraint-trigger", `CREATE TABLE postings (message_id text PRIMARY KEY, account text NOT NULL);
			CREATE FUNCTION check_posting() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF NEW.account = 'nope' THEN
					RAISE EXCEPTION 'unbalanced posting %', NEW.message_id;
				END IF;
				RETURN NULL;
			END $$;
			CREATE CONSTRAINT TRIGGER posting_balanced AFTER INSERT ON postings
				DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION check_posting()`, "unbalanced posting"},
	}
	for kn, kind := range kinds {
		for n, tc := range cases {
			t.Run(kind.name+"/"+tc.name, func(t *testing.T) {
				ctx := context.Background()
				k := testenv.KafkaT(t)
				pool := newPool(t)
				if _, err := pool.Exec(ctx, kind.ddl); err != nil {
					t.Fatal(err)
				}
				topic, group := fmt.Sprintf("postings-%d-%d", kn, n), fmt.Sprintf("g-deferred-%d-%d", kn, n)
				if err := k.CreateTopic(ctx, topic, 1); err != nil {
					t.Fatal(err)
				}
				vals := []string{"a/0", "b/0", "c/0", "nope/0", "d/0", "e/0"}
				produceValues(t, k, topic, vals...)
				cfg := baseConfig(k, group, topic)
				cfg.Shards = 1 // the records share batches
				cfg.Failures.UnknownAttempts = 2
				r := newEither(t, cfg, dbscope.Options{Pool: pool}, tc.h, tc.qh)
				runToEnd(t, r, k, group, topic, "every record done", time.Minute, func() bool { return r.Stats().Done == int64(len(vals)) })
				wantOutcomes(t, r, 5, 0, 1)
				wantEffectsOnce(t, effectKeys(t, pool), "a,b,c,d,e")
				var postings int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM postings`).Scan(&postings); err != nil {
					t.Fatal(err)
				}
				if postings != 5 {
					t.Fatalf("%d postings, want 5", postings)
				}
				dlt := dltByValue(t, k, group)
				if len(dlt) != 1 {
					t.Fatalf("DLT holds %d records, want nope/0", len(dlt))
				}
				wantDeadLetter(t, dlt["nope/0"], consumer.ClassUnknown, "2", kind.errPart)
			})
		}
	}
}

// A record released from the waiting table whose writes break a deferred
// constraint fails alone, as one in a batch does: it becomes its key's
// head and is routed by the failure policy (here to the DLT at once), and
// the records behind it are applied in order, each once. Before, the
// release transaction failed at COMMIT and was retried forever, holding
// the key.
func TestReleasedRecordBreakingADeferredConstraintFailsAlone(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id text PRIMARY KEY);
		CREATE TABLE postings (message_id text PRIMARY KEY,
			account text NOT NULL REFERENCES accounts DEFERRABLE INITIALLY DEFERRED);
		INSERT INTO accounts VALUES ('a')`); err != nil {
		t.Fatal(err)
	}
	const topic, group = "postings", "g-release-deferred"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Failures = retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		InPlaceAttempts: 1, Ladder: []time.Duration{100 * time.Millisecond}, RetryableAttempts: 1000, UnknownAttempts: 1}
	var open atomic.Bool
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			account := "a"
			switch string(r.Value) {
			case "K/0":
				if !open.Load() {
					return consumer.Retryable(errors.New("ledger 503"))
				}
			case "K/2":
				account = "nope" // no such account: refused at COMMIT
			}
			if _, err := tx.Exec(ctx, `INSERT INTO postings VALUES ($1, $2)`, string(r.Value), account); err != nil {
				return err
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("K"), Value: []byte("K/0")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "K/0 in the retry topics", func() bool { return r.Stats().Failures.RetryTopic >= 1 })
	var later []*kgo.Record
	for _, v := range []string{"K/1", "K/2", "K/3", "K/4"} {
		later = append(later, &kgo.Record{Topic: topic, Key: []byte("K"), Value: []byte(v)})
	}
	if err := k.Produce(ctx, later...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "K/1 to K/4 waiting", func() bool { return r.Stats().DB.Parked >= 4 })
	open.Store(true)
	testenv.WaitFor(t, time.Minute, "K/2 dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 1 })
	testenv.WaitFor(t, time.Minute, "the others applied", func() bool { return countEffects(t, pool).unique == 4 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(effectOrder(t, pool), ","); got != "K/0,K/1,K/3,K/4" {
		t.Fatalf("effects %s, want K/0,K/1,K/3,K/4, each once, in order", got)
	}
	dlt := dltByValue(t, k, group)
	if len(dlt) != 1 {
		t.Fatalf("DLT holds %d records, want K/2", len(dlt))
	}
	wantDeadLetter(t, dlt["K/2"], consumer.ClassUnknown, "1", "postings_account_fkey")
	var parked, waiting, postings int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM kscope_parked), (SELECT count(*) FROM kscope_waiting), (SELECT count(*) FROM postings)`).Scan(&parked, &waiting, &postings); err != nil {
		t.Fatal(err)
	}
	if parked != 0 || waiting != 0 || postings != 4 {
		t.Fatalf("%d parked and %d waiting rows left, %d postings; want none, none and 4", parked, waiting, postings)
	}
}

// A queued statement whose arguments pgx cannot encode fails the record
// that queued it, not the first record that queued the same SQL: that
// healthy record is applied once, and only the bad one is dead-lettered.
// pgx reports an encoding error for the whole batch, naming only the SQL.
func TestUnencodableArgumentFailsOnlyItsRecord(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "unencodable", "g-unencodable"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	vals := []string{"a/0", "b/0", "bad/0", "c/0"}
	produceValues(t, k, topic, vals...)
	qh := dbscope.QueueFunc(func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
		key, _, _ := testenv.ParseKeyed(r.Value)
		if key == "bad" {
			// A seq pgx has no encoding for (a struct, for an int column).
			q.Exec(`INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`, consumer.Identity{}.Of(r), key, struct{ N int }{1})
			return nil
		}
		return queueEffect(ctx, q, r)
	})
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1 // the records share batches
	cfg.Failures.UnknownAttempts = 2
	r, err := dbscope.NewQueued(cfg, dbscope.Options{Pool: pool}, qh)
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every record done", time.Minute, func() bool { return r.Stats().Done == int64(len(vals)) })
	wantEffectsOnce(t, effectKeys(t, pool), "a,b,c")
	dlt := dltByValue(t, k, group)
	if len(dlt) != 1 || dlt["bad/0"] == nil {
		t.Fatalf("DLT holds %d records (%v), want only bad/0", len(dlt), slices.Collect(maps.Keys(dlt)))
	}
	wantDeadLetter(t, dlt["bad/0"], consumer.ClassUnknown, "2", "encode")
}

// A server out of disk space fails every write with SQLSTATE 53100: the
// batch retries in place, holding its offsets, and no record is counted a
// failure or dead-lettered for the server's state; once space is freed,
// every record is applied once.
func TestDiskFullRetriesInPlace(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE disk (is_full boolean NOT NULL);
		INSERT INTO disk VALUES (true);
		CREATE FUNCTION check_disk() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT is_full FROM disk) THEN
				RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER effects_disk BEFORE INSERT ON effects FOR EACH ROW EXECUTE FUNCTION check_disk()`); err != nil {
		t.Fatal(err)
	}
	const topic, group = "diskfull", "g-diskfull"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	vals := []string{"a/0", "b/0", "c/0"}
	produceValues(t, k, topic, vals...)
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1
	cfg.Failures.UnknownAttempts = 2
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		return insertEffect(ctx, tx, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "retries in place", func() bool { return r.Stats().DB.TxRetries >= 5 })
	if st := r.Stats(); st.Done != 0 || st.Failures.DeadLettered != 0 {
		t.Fatalf("stats %+v while the disk is full: want nothing done or dead-lettered", st)
	}
	if _, err := pool.Exec(ctx, `UPDATE disk SET is_full = false`); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "every record applied", func() bool { return r.Stats().Done == int64(len(vals)) })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantOutcomes(t, r, 3, 0, 0)
	wantEffectsOnce(t, effectKeys(t, pool), "a,b,c")
}

// A COMMIT that fails transiently (a deferred constraint trigger meeting a
// serialization failure) is retried in place, and once it succeeds every
// record is applied once. The failed COMMIT has handed the connection back
// to the pool, where another worker may be using it: nothing of the failed
// transaction reads it any more (under -race, reading whether it had
// closed was a data race with that worker).
func TestTransientCommitFailureIsRetriedInPlace(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE contention (on_commit boolean NOT NULL);
		INSERT INTO contention VALUES (true);
		CREATE FUNCTION check_contention() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT on_commit FROM contention) THEN
				RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001';
			END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER effects_contention AFTER INSERT ON effects
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION check_contention()`); err != nil {
		t.Fatal(err)
	}
	const topic, group = "commitretry", "g-commitretry"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	var vals []string
	for i := range 8 {
		vals = append(vals, fmt.Sprintf("k%d/0", i))
	}
	produceValues(t, k, topic, vals...)
	cfg := baseConfig(k, group, topic)
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		return insertEffect(ctx, tx, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "COMMITs retried in place", func() bool { return r.Stats().DB.TxRetries >= 10 })
	if st := r.Stats(); st.Done != 0 || st.Failures.DeadLettered != 0 {
		t.Fatalf("stats %+v while every COMMIT fails: want nothing done or dead-lettered", st)
	}
	if _, err := pool.Exec(ctx, `UPDATE contention SET on_commit = false`); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "every record applied", func() bool { return r.Stats().Done == int64(len(vals)) })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if c := countEffects(t, pool); c.rows != len(vals) || c.unique != len(vals) {
		t.Fatalf("%d effects (%d distinct), want %d, each once", c.rows, c.unique, len(vals))
	}
}

// recordsFault is a Policy.Classify for handlers whose SQL comes from the
// record (a table per tenant, a statement the record carries): an
// undefined table or a syntax error is the record's fault, an unknown
// failure, not a deployment to hold for.
func recordsFault(err error) (consumer.Class, bool) {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "42601") && retrytopic.ClassOf(err) == consumer.ClassUnknown {
		return consumer.ClassUnknown, true // unless the handler marked it
	}
	return 0, false
}
