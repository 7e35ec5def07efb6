package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/outbox"
	"github.com/kscope-dev/kscope/retrytopic"
)

// nextSeq returns the next sequence number partition 0 of the default
// outbox hands out.
func nextSeq(t *testing.T, pool *pgxpool.Pool) (n int64) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT next_seq FROM kscope_outbox_sequences WHERE outbox = 'default' AND partition = 0`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A requeued row is published once, with the identity it was written
// with: after the relay refused it and dead-lettered it, Requeue puts it
// at the end of its partition through the sequence row (a row written
// after it takes the next number), a relay that still refuses it
// dead-letters it again under that identity, and one that takes it
// publishes it under that identity, after the records of its key written
// since. A second Requeue finds nothing to do.
func TestRequeuedRowKeepsItsIdentity(t *testing.T) {
	ctx := context.Background()
	k, pool, _ := setup(t)
	w := outbox.Writer{Partitions: 1}
	big := bytes.Repeat([]byte("x"), 100<<10)
	addRows(t, pool, w, "payments.booked", "a", []byte("a/0"), []byte("a/1"), big, []byte("a/2"))
	limited := outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0},
		Logger: logger(), PollInterval: 20 * time.Millisecond, ClientOptions: []kgo.Opt{kgo.ProducerBatchMaxBytes(64 << 10)}}
	r, stop := runRelay(t, limited)
	caughtUp(t, r, 4, "the rows around the oversized one published")
	dl := outbox.DeadLetters{DB: pool}

	// Requeued while Kafka still refuses it: dead-lettered again, with
	// its identity, from its new place.
	q, err := dl.Requeue(ctx, "default/0/3", "")
	if err != nil {
		t.Fatal(err)
	}
	if q.ID != "default/0/3" || q.Partition != 0 || q.Seq != 5 || q.Topic != "payments.booked" || q.Copies != 1 {
		t.Fatalf("Requeue returned %+v, want default/0/3 at partition 0 sequence number 5, to payments.booked", q)
	}
	caughtUp(t, r, 5, "the requeued row refused again")
	testenv.WaitFor(t, 30*time.Second, "the row dead-lettered again", func() bool { return r.Stats().DeadLettered == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	dead, err := dl.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].ID != "default/0/3" || dead[0].Seq != 5 || dead[0].Size != len("a")+len(big)+25 {
		t.Fatalf("dead-letter table %+v, want default/0/3 alone, dead-lettered from sequence number 5, of %d bytes", dead, len("a")+len(big)+25)
	}

	// The cause fixed (the producer's default limit takes 100 KiB).
	fixed := limited
	fixed.ClientOptions = nil
	r, stop = runRelay(t, fixed)
	if _, err := dl.Requeue(ctx, "default/0/3", ""); err != nil {
		t.Fatal(err)
	}
	addRows(t, pool, w, "payments.booked", "a", []byte("a/3"))
	if n := nextSeq(t, pool); n != 8 {
		t.Fatalf("next sequence number %d after the requeue and one more row, want 8: the requeue numbers its row through the sequence row", n)
	}
	caughtUp(t, r, 7, "the requeued row and the one after it published")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var got []string
	ids := map[string]int{}
	for _, rec := range k.ReadAll(t, "payments.booked") {
		v := string(rec.Value)
		if len(v) > 8 {
			v = "big"
		}
		got = append(got, v+"@"+testenv.Header(rec, retrytopic.HeaderID))
		ids[testenv.Header(rec, retrytopic.HeaderID)]++
	}
	// Per-key order is not restored: the requeued record comes after the
	// record of its key written after it.
	want := "a/0@default/0/1 a/1@default/0/2 a/2@default/0/4 big@default/0/3 a/3@default/0/7"
	if strings.Join(got, " ") != want {
		t.Errorf("published\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("identity %s published %d times", id, n)
		}
	}
	if d := deadRows(t, pool); len(d) != 0 {
		t.Errorf("dead-letter table %+v after the requeue, want it empty", d)
	}
	if _, err := dl.Requeue(ctx, "default/0/3", ""); !errors.Is(err, outbox.ErrNotDead) {
		t.Errorf("a second Requeue returned %v, want ErrNotDead", err)
	}
	if n := nextSeq(t, pool); n != 8 {
		t.Errorf("next sequence number %d after a Requeue that found nothing, want 8", n)
	}
}

// insertDead writes a row to the dead-letter table as the relay does.
func insertDead(t *testing.T, pool *pgxpool.Pool, seq int64, topic, key, value string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO kscope_outbox_dead (outbox, partition, seq, topic, key, value, headers, created_at, error)
		VALUES ('default', 0, $1, $2, $3, $4, NULL, now(), 'MESSAGE_TOO_LARGE')`, seq, topic, []byte(key), []byte(value)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO kscope_outbox_sequences (outbox, partition, next_seq) VALUES ('default', 0, $1 + 1)
		ON CONFLICT (outbox, partition) DO UPDATE SET next_seq = greatest(kscope_outbox_sequences.next_seq, $1 + 1)`, seq); err != nil {
		t.Fatal(err)
	}
}

// A requeue whose insert into the outbox fails changes nothing: the row
// stays in the dead-letter table and no sequence number is taken. A
// requeue to a topic name Kafka does not allow is refused the same way.
func TestRequeueIsOneTransaction(t *testing.T) {
	ctx := context.Background()
	_, pool, _ := setup(t)
	insertDead(t, pool, 3, "payments.booked", "a", "refused")
	insertDead(t, pool, 4, "payments booked!", "a", "misnamed")
	for _, q := range []string{
		`CREATE FUNCTION fail_insert() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'disk full'; END; $$ LANGUAGE plpgsql`,
		`CREATE TRIGGER fail_insert BEFORE INSERT ON kscope_outbox FOR EACH ROW EXECUTE FUNCTION fail_insert()`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	dl := outbox.DeadLetters{DB: pool}
	if _, err := dl.Requeue(ctx, "default/0/3", ""); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Requeue with a failing insert returned %v, want the insert's error", err)
	}
	if _, err := dl.Requeue(ctx, "default/0/4", ""); err == nil || !strings.Contains(err.Error(), "not a Kafka topic name") {
		t.Fatalf("Requeue of a row to a topic name Kafka does not allow returned %v, want a refusal", err)
	}
	if d := deadRows(t, pool); len(d) != 2 || outboxRows(t, pool) != 0 || nextSeq(t, pool) != 5 {
		t.Fatalf("after failed requeues: dead-letter table %+v, %d outbox rows, next sequence number %d; want both rows dead, none in the outbox, 5",
			d, outboxRows(t, pool), nextSeq(t, pool))
	}
	if _, err := pool.Exec(ctx, `DROP TRIGGER fail_insert ON kscope_outbox`); err != nil {
		t.Fatal(err)
	}
	q, err := dl.Requeue(ctx, "default/0/4", "payments.booked")
	if err != nil {
		t.Fatal(err)
	}
	var id, topic string
	if err := pool.QueryRow(ctx, `SELECT id, topic FROM kscope_outbox WHERE outbox = 'default' AND partition = 0 AND seq = $1`, q.Seq).Scan(&id, &topic); err != nil {
		t.Fatal(err)
	}
	if q.Seq != 5 || id != "default/0/4" || topic != "payments.booked" {
		t.Errorf("requeued as sequence number %d, identity %q, topic %q; want 5, default/0/4, payments.booked", q.Seq, id, topic)
	}
	if err := dl.Discard(ctx, "default/0/3"); err != nil {
		t.Fatal(err)
	}
	if err := dl.Discard(ctx, "default/0/3"); !errors.Is(err, outbox.ErrNotDead) {
		t.Errorf("a second Discard returned %v, want ErrNotDead", err)
	}
	if d := deadRows(t, pool); len(d) != 0 {
		t.Errorf("dead-letter table %+v, want it empty", d)
	}
}

// A relay, and the dead-letter functions, on a database that lacks the
// identity column of requeued rows (kscope upgraded, Migrate not run
// again) say to run Migrate, naming the column; writers go on meanwhile,
// and once Migrate ran the relay publishes what they wrote. The migration
// is idempotent.
func TestWithoutTheIdentityColumnSaysToRunMigrate(t *testing.T) {
	ctx := context.Background()
	k, pool, _ := setup(t)
	for _, q := range []string{
		`ALTER TABLE kscope_outbox DROP COLUMN id`,
		`ALTER TABLE kscope_outbox_dead DROP COLUMN id`,
		`DELETE FROM kscope_schema_migrations WHERE version = 13`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	addRows(t, pool, outbox.Writer{Partitions: 1}, "payments.booked", "a", []byte("a/0"))
	o := outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0}, Logger: logger(), PollInterval: 20 * time.Millisecond}
	r, err := outbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = r.Run(rctx)
	var se *dbscope.SchemaError
	if rctx.Err() != nil || !errors.As(err, &se) || !strings.Contains(err.Error(), "kscope_outbox.id") || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Run returned %v, want a *dbscope.SchemaError naming kscope_outbox.id and saying to run Migrate", err)
	}
	if _, err := (outbox.DeadLetters{DB: pool}).List(ctx, ""); !errors.As(err, &se) || !strings.Contains(err.Error(), "kscope_outbox_dead.id") {
		t.Fatalf("List returned %v, want a *dbscope.SchemaError naming kscope_outbox_dead.id", err)
	}
	if err := outbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	r, stop := runRelay(t, o)
	caughtUp(t, r, 1, "the row written before Migrate published")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, map[string][]string{"a": {"a/0"}})
	// The migration applies again over the columns it added.
	if _, err := pool.Exec(ctx, `DELETE FROM kscope_schema_migrations WHERE version = 13`); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatalf("Migrate applying 013 a second time: %v", err)
	}
}
