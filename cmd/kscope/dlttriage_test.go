package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// ledgerDB returns a migrated database with an empty ledger table, and
// its URL.
func ledgerDB(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	url := testenv.DatabaseT(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (entry text)`); err != nil {
		t.Fatal(err)
	}
	return pool, url
}

// ledgerEntries returns the ledger's entries in order.
func ledgerEntries(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var out []string
	rows, err := pool.Query(context.Background(), `SELECT entry FROM ledger ORDER BY entry`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var e string
		if err := rows.Scan(&e); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return strings.Join(out, ",")
}

// startLedger runs a DB-scope runner of group ledger over topic that
// dead-letters the values poison reports, and returns it and the function
// that stops it and waits for its group to be empty.
func startLedger(t *testing.T, k *testenv.Kafka, pool *pgxpool.Pool, topic string, poison func(string) bool) (*dbscope.Runner, func()) {
	t.Helper()
	r, err := dbscope.New(consumer.Config{
		Brokers: k.Brokers, Group: "ledger", Topics: []string{topic},
		CommitInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	}, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		if poison(string(r.Value)) {
			return consumer.Terminal(errors.New("unknown currency"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, string(r.Value))
		return err
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var stopped atomic.Bool
	stop := func() {
		if stopped.Swap(true) {
			return
		}
		cancel()
		if err := <-errc; err != nil {
			t.Error(err)
		}
		testenv.WaitFor(t, time.Minute, "the group empty", func() bool {
			gs, err := k.Admin().DescribeGroups(context.Background(), "ledger")
			return err == nil && gs["ledger"].State == "Empty"
		})
	}
	t.Cleanup(stop)
	return r, stop
}

// A dead letter redriven with an edited value (the built binary) is
// applied once with that value; a later redrive of the original is a
// no-op; the audit log holds both values, the reason and the approver.
func TestEditedRedriveAppliesTheEditOnceAndAuditsBothValues(t *testing.T) {
	bin := kscopeBinary(t)
	k := testenv.KafkaT(t)
	pool, _ := ledgerDB(t)
	const topic = "captures"
	createTopic(t, k, topic, 1)
	produceTo(t, k, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("good")},
		&kgo.Record{Topic: topic, Key: []byte("b"), Value: []byte("12 EURO")})
	r, _ := startLedger(t, k, pool, topic, func(v string) bool { return strings.Contains(v, "EURO") })
	testenv.WaitFor(t, time.Minute, "the poison record dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 1 })

	file := filepath.Join(t.TempDir(), "fixed.json")
	if err := os.WriteFile(file, []byte("12 EUR"), 0o600); err != nil {
		t.Fatal(err)
	}
	edit := []string{"dlt", "redrive", brokers(k), "--group", "ledger", "--to", "source", "--partition", "0", "--offset", "0", "--payload-file", file}
	kscopeBin(t, bin, nil, edit...).want(t, exitUsage, "--reason")
	kscopeBin(t, bin, nil, append(edit, "--reason", "currency code typo", "--approve", "carol", "--by", "oncall")...).
		want(t, exitOK, "redrive: sent partition 0 offset 0 (key b", "to captures with the edited value", "keeps both values",
			"committed partition 0 offset 1 under group ledger.kscope-triage")
	testenv.WaitFor(t, time.Minute, "the edited record applied", func() bool { return ledgerEntries(t, pool) == "12 EUR,good" })

	dups := r.Stats().DB.Duplicates
	kscopeBin(t, bin, nil, "dlt", "redrive", brokers(k), "--group", "ledger", "--to", "source").want(t, exitOK, "sent 1 of 1 matching record")
	testenv.WaitFor(t, time.Minute, "the original's redrive seen as a duplicate", func() bool { return r.Stats().DB.Duplicates == dups+1 })
	if got := ledgerEntries(t, pool); got != "12 EUR,good" {
		t.Fatalf("ledger %s: the edited dead letter was applied twice, or its original", got)
	}

	es := auditEntries(t, bin, k, "ledger")
	if len(es) != 1 {
		t.Fatalf("audit log: %+v", es)
	}
	a := es[0]
	if a.Action != actionRedriveEdited || a.ApprovedBy != "carol" || a.Operator != "oncall" || a.Reason != "currency code typo" || a.Payload == nil ||
		string(a.Payload.Original) != "12 EURO" || string(a.Payload.Edited) != "12 EUR" || len(a.DeadLetters) != 1 || a.DeadLetters[0].Key != "b" {
		t.Fatalf("audit record: %+v payload %+v", a, a.Payload)
	}
	kscopeBin(t, bin, nil, "audit", brokers(k)).want(t, exitOK, actionRedriveEdited, "carol", "currency code typo", "0/0(")
}

// A skipped dead letter (the built binary) is not resurrected: a redrive
// of the whole dead-letter topic does not send it, and a replay of the
// source topic does not apply it, though its handler would now succeed.
// It stops waiting for triage, and the audit log holds the skip.
func TestSkippedDeadLetterIsNotResurrected(t *testing.T) {
	bin := kscopeBinary(t)
	k := testenv.KafkaT(t)
	pool, url := ledgerDB(t)
	const topic = "captures"
	createTopic(t, k, topic, 1)
	produceTo(t, k, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("good")},
		&kgo.Record{Topic: topic, Key: []byte("b"), Value: []byte("bad")})
	var fixed atomic.Bool
	poison := func(v string) bool { return v == "bad" && !fixed.Load() }
	r, stop := startLedger(t, k, pool, topic, poison)
	testenv.WaitFor(t, time.Minute, "the poison record dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 1 })
	kscopeBin(t, bin, nil, "dlt", "list", brokers(k), "--group", "ledger").want(t, exitOK, "1 waiting for triage")

	skip := []string{"dlt", "skip", brokers(k), "--group", "ledger", "--partition", "0", "--offset", "0", "--database-url", url}
	kscopeBin(t, bin, nil, skip...).want(t, exitUsage, "--reason")
	kscopeBin(t, bin, nil, append(skip, "--reason", "refunded by hand")...).want(t, exitUsage, "--scope db")
	kscopeBin(t, bin, nil, append(skip, "--reason", "refunded by hand", "--scope", "db")...).
		want(t, exitOK, "skipped partition 0 offset 0 (key b", "1 identity marked resolved in the inbox", "committed partition 0 offset 1 under group ledger.kscope-triage")
	kscopeBin(t, bin, nil, "dlt", "list", brokers(k), "--group", "ledger").want(t, exitOK, "0 waiting for triage")

	fixed.Store(true) // a resurrected record would now be applied
	before := k.ReadAll(t, topic)
	kscopeBin(t, bin, nil, "dlt", "redrive", brokers(k), "--group", "ledger", "--to", "source").
		want(t, exitOK, "not sending partition 0 offset 0", "kscope dlt skip resolved it", "1 dead letter resolved by kscope dlt skip (not sent)")
	if after := k.ReadAll(t, topic); len(after) != len(before) {
		t.Fatalf("the redrive sent a skipped dead letter: %d records, was %d", len(after), len(before))
	}

	stop()
	kscopeBin(t, bin, nil, "replay", brokers(k), "--group", "ledger", "--topic", topic, "--to-start", "--yes").want(t, exitOK, "committed: group ledger")
	r, _ = startLedger(t, k, pool, topic, poison)
	testenv.WaitFor(t, time.Minute, "the replayed records seen as duplicates", func() bool { return r.Stats().DB.Duplicates == 2 })
	if got := ledgerEntries(t, pool); got != "good" {
		t.Fatalf("ledger %s: a replay resurrected the skipped dead letter", got)
	}
	es := auditEntries(t, bin, k, "ledger")
	if len(es) != 2 || es[0].Action != actionSkip || es[0].Reason != "refunded by hand" || len(es[0].DeadLetters) != 1 || es[0].DeadLetters[0].Key != "b" {
		t.Fatalf("audit log: %+v", es)
	}
}
