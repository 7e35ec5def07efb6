package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/outbox"
	"github.com/kscope-dev/kscope/retrytopic"
)

// outboxDB returns a migrated database's URL and a pool on it.
func outboxDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := testenv.DatabaseT(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := outbox.Migrate(context.Background(), pool, ""); err != nil {
		t.Fatal(err)
	}
	return url, pool
}

// addOutbox adds one record per value, with key and a content-type
// header, to the one-partition default outbox, in one transaction.
func addOutbox(t *testing.T, pool *pgxpool.Pool, topic, key string, values ...[]byte) {
	t.Helper()
	ctx := context.Background()
	w := outbox.Writer{Partitions: 1}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, v := range values {
			if _, err := w.Add(ctx, tx, &kgo.Record{Topic: topic, Key: []byte(key), Value: v,
				Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("text/plain")}}}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// startRelay runs a relay of the one-partition default outbox with opts
// until the returned stop is called (or the test ends).
func startRelay(t *testing.T, k *testenv.Kafka, pool *pgxpool.Pool, opts ...kgo.Opt) (*outbox.Relay, func()) {
	t.Helper()
	r, err := outbox.New(outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0},
		PollInterval: 20 * time.Millisecond, ClientOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the relay failed: %v", err)
		}
	}
	t.Cleanup(stop)
	return r, stop
}

// outboxCounts returns the rows of the outbox and of the dead-letter
// table.
func outboxCounts(t *testing.T, pool *pgxpool.Pool) (rows, dead int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM kscope_outbox), (SELECT count(*) FROM kscope_outbox_dead)`).Scan(&rows, &dead); err != nil {
		t.Fatal(err)
	}
	return rows, dead
}

// A row the relay's producer refuses (its record batches capped at 64
// KiB) is dead-lettered; outbox dead list and show print it, status
// counts it; requeue --dry-run and requeue without --yes change nothing;
// once the cause is fixed (a relay at the producer's default limit),
// requeue --yes publishes it once, with its original kscope-id, and a
// second requeue of the same ID does nothing and says so.
func TestOutboxDeadRequeue(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	createTopic(t, k, "events", 1)
	url, pool := outboxDB(t)
	big := bytes.Repeat([]byte("x"), 100<<10)
	addOutbox(t, pool, "events", "a", []byte("a/0"), big, []byte("a/1"))
	r, stop := startRelay(t, k, pool, kgo.ProducerBatchMaxBytes(64<<10))
	testenv.WaitFor(t, time.Minute, "the oversized row dead-lettered and the others published", func() bool {
		st := r.Stats()
		return st.DeadLettered == 1 && st.Published == 2
	})
	stop()
	db := "--database-url=" + url
	size := len("a") + len(big) + 25 // key, value, and the content-type header as the outbox encodes it

	res := kscope(t, "outbox", "dead", "list", db)
	res.want(t, exitOK, "ID", "TOPIC", "KEY", "BYTES", "DEAD SINCE", "ERROR", "1 dead row in the dead-letter table of every outbox")
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	if f := strings.Fields(lines[1]); len(f) < 6 || f[0] != "default/0/2" || f[1] != "events" || f[2] != "a" || f[3] != "102426" || !strings.HasPrefix(f[5], kerr.MessageTooLarge.Message) {
		t.Fatalf("row %q, want default/0/2 to events, key a, %d bytes, MESSAGE_TOO_LARGE", lines[1], size)
	}
	res = kscope(t, "outbox", "dead", "list", db, "--outbox", "other")
	res.want(t, exitOK, "0 dead rows in the dead-letter table of outbox other")

	res = kscope(t, "outbox", "dead", "list", db, "--json")
	res.want(t, exitOK)
	var entry deadEntry
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.stdout)), &entry); err != nil {
		t.Fatalf("list --json printed %q: %v", res.stdout, err)
	}
	if entry.ID != "default/0/2" || entry.Outbox != "default" || entry.Partition != 0 || entry.Seq != 2 || entry.Topic != "events" ||
		entry.Key == nil || *entry.Key != "a" || entry.Bytes != size || !strings.Contains(entry.Error, kerr.MessageTooLarge.Message) || entry.DeadAt == "" {
		t.Fatalf("list --json: %+v", entry)
	}

	res = kscope(t, "outbox", "dead", "show", "default/0/2", db, "--max-value", "8")
	res.want(t, exitOK, "id:         default/0/2", "partition 0, sequence number 2", "topic:      events", "key:        a",
		"content-type: text/plain", "kscope-id: default/0/2 when published", "102400 bytes, text, first 8 shown", "xxxxxxxx\n", kerr.MessageTooLarge.Message)
	res = kscope(t, "outbox", "dead", "show", db, "--json", "default/0/2")
	res.want(t, exitOK)
	var shown deadShowEntry
	if err := json.Unmarshal([]byte(res.stdout), &shown); err != nil {
		t.Fatalf("show --json printed %q: %v", res.stdout, err)
	}
	if shown.ID != "default/0/2" || len(shown.Headers) != 1 || shown.Headers[0].Key != "content-type" || shown.ValueSize != len(big) ||
		!shown.ValueTruncated || shown.Value == nil || len(*shown.Value) != 4096 {
		t.Fatalf("show --json: %+v", shown)
	}
	kscope(t, "outbox", "dead", "show", db, "default/0/9").want(t, exitFailure, "default/0/9 is not in the dead-letter table")
	kscope(t, "outbox", "dead", "show", db).want(t, exitUsage, "give one row's identity")

	kscope(t, "outbox", "status", brokers(k), db, "--partitions", "1").want(t, exitOK, "DEAD", "1 row in the dead-letter table")
	kscope(t, "outbox", "status", brokers(k), db, "--partitions", "1", "--json").want(t, exitOK, `"position":3`, `"dead":1`)

	kscope(t, "outbox", "dead", "requeue", "default/0/2", db, "--dry-run").want(t, exitOK,
		"would requeue default/0/2 (events, key a, 102426 bytes", "at the end of outbox default partition 0", "dry run: nothing changed")
	kscope(t, "outbox", "dead", "requeue", db, "default/0/2").want(t, exitOK, "would requeue default/0/2", "re-run with --yes to requeue 1 row")
	if rows, dead := outboxCounts(t, pool); rows != 0 || dead != 1 {
		t.Fatalf("%d outbox rows and %d dead rows after a dry run and a requeue without --yes, want 0 and 1", rows, dead)
	}

	// The cause fixed: the producer at its default limit takes 100 KiB.
	r, stop = startRelay(t, k, pool)
	kscope(t, "outbox", "dead", "requeue", db, "default/0/2", "--yes").want(t, exitOK,
		"requeued default/0/2 (events, key a", "outbox default partition 0, sequence number 4", "requeued 1 of 1 row")
	// The relay deletes a published row after the transaction that
	// published it commits: wait for both before stopping it.
	testenv.WaitFor(t, time.Minute, "the requeued row published and deleted", func() bool {
		rows, _ := outboxCounts(t, pool)
		return r.Stats().Published == 1 && rows == 0
	})
	stop()
	recs := k.ReadAll(t, "events")
	ids := map[string]int{}
	for _, rec := range recs {
		ids[testenv.Header(rec, retrytopic.HeaderID)]++
	}
	last := recs[len(recs)-1]
	if len(recs) != 3 || len(ids) != 3 || !bytes.Equal(last.Value, big) || testenv.Header(last, retrytopic.HeaderID) != "default/0/2" || testenv.Header(last, "content-type") != "text/plain" {
		t.Fatalf("events holds %d records, identities %v, the last of %d bytes as %q; want 3, each identity once, the requeued one last as default/0/2 with its headers",
			len(recs), ids, len(last.Value), testenv.Header(last, retrytopic.HeaderID))
	}
	if rows, dead := outboxCounts(t, pool); rows != 0 || dead != 0 {
		t.Fatalf("%d outbox rows and %d dead rows after the requeue was published, want none", rows, dead)
	}
	kscope(t, "outbox", "dead", "list", db).want(t, exitOK, "0 dead rows")

	res = kscope(t, "outbox", "dead", "requeue", db, "default/0/2", "--yes")
	res.want(t, exitFailure, "nothing to requeue", "not in the dead-letter table (requeued or discarded already, or never dead-lettered): default/0/2")
	var next int64
	if err := pool.QueryRow(ctx, `SELECT next_seq FROM kscope_outbox_sequences`).Scan(&next); err != nil {
		t.Fatal(err)
	}
	if rows, _ := outboxCounts(t, pool); rows != 0 || next != 5 {
		t.Fatalf("a second requeue left %d outbox rows and the next sequence number at %d, want none and 5", rows, next)
	}
}

// deadRowAt writes a dead-letter row of the default outbox's partition 0,
// as a relay does.
func deadRowAt(t *testing.T, pool *pgxpool.Pool, seq int64, topic, value string) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO kscope_outbox_dead (outbox, partition, seq, topic, key, value, headers, created_at, error)
		VALUES ('default', 0, $1, $2, 'k', $3, NULL, now(), 'INVALID_TOPIC_EXCEPTION')`, seq, topic, []byte(value)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO kscope_outbox_sequences (outbox, partition, next_seq) VALUES ('default', 0, $1 + 1)
		ON CONFLICT (outbox, partition) DO UPDATE SET next_seq = greatest(kscope_outbox_sequences.next_seq, $1 + 1)`, seq); err != nil {
		t.Fatal(err)
	}
}

// discard deletes a dead row, and its record is never published, while
// a relay runs; --dry-run and discard without --yes change nothing. A row
// to a topic name Kafka does not allow is requeued only with --topic. The
// command line is checked, and a database that lacks the migration is
// told to run it.
func TestOutboxDeadDiscard(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	createTopic(t, k, "events", 1)
	url, pool := outboxDB(t)
	db := "--database-url=" + url
	deadRowAt(t, pool, 1, "events", "discard me")
	deadRowAt(t, pool, 2, "bad topic!", "misnamed")
	r, _ := startRelay(t, k, pool)

	kscope(t, "outbox", "dead", "discard", db, "default/0/1", "--dry-run").want(t, exitOK, "would discard default/0/1 (events, key k", "dry run: nothing changed")
	kscope(t, "outbox", "dead", "discard", db, "default/0/1").want(t, exitOK, "re-run with --yes to discard 1 row")
	if _, dead := outboxCounts(t, pool); dead != 2 {
		t.Fatalf("%d dead rows after a dry run and a discard without --yes, want 2", dead)
	}
	kscope(t, "outbox", "dead", "discard", db, "--yes", "default/0/1").want(t, exitOK, "discarded default/0/1", "discarded 1 of 1 row")
	kscope(t, "outbox", "dead", "discard", db, "--yes", "default/0/1").want(t, exitFailure, "not in the dead-letter table", "default/0/1")
	res := kscope(t, "outbox", "dead", "list", db)
	res.want(t, exitOK, "default/0/2", "1 dead row")
	if strings.Contains(res.stdout, "default/0/1") {
		t.Fatalf("the discarded row is still listed:\n%s", res.stdout)
	}

	// The misnamed row is not requeued as it is, and is with --topic.
	kscope(t, "outbox", "dead", "requeue", db, "--all", "--yes").want(t, exitFailure,
		`not requeued default/0/2`, `its topic "bad topic!" is not a Kafka topic name`, "--topic", "1 row not requeued")
	kscope(t, "outbox", "dead", "requeue", db, "default/0/2", "--topic", "events", "--yes").want(t, exitOK,
		"requeued default/0/2 (bad topic!, key k", "to events", "sequence number 3")
	testenv.WaitFor(t, time.Minute, "the requeued row published", func() bool { return r.Stats().Published == 1 })
	// A row written after the discard is published after the requeued
	// one: the relay went past where the discarded row was.
	addOutbox(t, pool, "events", "k", []byte("after"))
	testenv.WaitFor(t, time.Minute, "the row written last published", func() bool { return r.Stats().Published == 2 })
	var got []string
	for _, rec := range k.ReadAll(t, "events") {
		got = append(got, string(rec.Value)+"@"+testenv.Header(rec, retrytopic.HeaderID))
	}
	if want := "misnamed@default/0/2 after@default/0/4"; strings.Join(got, " ") != want {
		t.Fatalf("events holds %v, want %s: the discarded row never published", got, want)
	}
	kscope(t, "outbox", "dead", "discard", db, "--all", "--yes").want(t, exitOK, "nothing to discard")

	kscope(t, "outbox", "dead", "requeue", db).want(t, exitUsage, "give the identities of the rows to requeue")
	kscope(t, "outbox", "dead", "discard", db, "--all", "default/0/1").want(t, exitUsage, "either row identities or --all")
	kscope(t, "outbox", "dead", "requeue", db, "default/0/1", "--topic", "no such topic").want(t, exitUsage, "not a Kafka topic name")
	t.Setenv("DATABASE_URL", "")
	kscope(t, "outbox", "dead", "list").want(t, exitUsage, "no database given: set --database-url or DATABASE_URL")

	if _, err := pool.Exec(ctx, `ALTER TABLE kscope_outbox_dead DROP COLUMN id`); err != nil {
		t.Fatal(err)
	}
	kscope(t, "outbox", "dead", "list", db).want(t, exitFailure, "kscope_outbox_dead.id", "dbscope.Migrate")
}

// "kscope outbox" and "kscope outbox dead" list their commands, and each
// command's help says what it does not restore.
func TestOutboxDeadHelp(t *testing.T) {
	kscope(t, "outbox").want(t, exitUsage, "kscope outbox status", "kscope outbox dead requeue")
	kscope(t, "outbox", "dead").want(t, exitUsage, "kscope outbox dead list", "kscope outbox dead show", "kscope outbox dead discard")
	kscope(t, "outbox", "dead", "help").want(t, exitOK, "kscope outbox dead requeue")
	kscope(t, "help", "outbox", "dead").want(t, exitOK, "kscope outbox dead discard")
	kscope(t, "outbox", "dead", "purge").want(t, exitUsage, `kscope outbox dead: unknown subcommand "purge"`)
	kscope(t, "help", "outbox", "dead", "requeue").want(t, exitOK, "per-key order is not restored", "kscope-id", "--dry-run", "--yes", "--topic")
	kscope(t, "help").want(t, exitOK, "outbox dead requeue", "DATABASE_URL")
	kscope(t, "outbox", "status", "extra").want(t, exitUsage, `unexpected argument "extra"`)
}
