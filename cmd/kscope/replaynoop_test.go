package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

const ledgerPolicy = `version: 1
consumers:
  - group: ledger
    scope: db
    owner: {team: payments, contact: "#payments-oncall"}
    replay: true
    critical: true
`

// applyLedger runs a DB-scope runner of group ledger over topic until it
// applied n records and committed their offsets, then stops it: the group
// is left without members.
func applyLedger(t *testing.T, k *testenv.Kafka, pool *pgxpool.Pool, topic string, n int64) {
	t.Helper()
	ctx := context.Background()
	r, err := dbscope.New(consumer.Config{
		Brokers: k.Brokers, Group: "ledger", Topics: []string{topic},
		CommitInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	}, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, string(r.Value))
		return err
	}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(runCtx) }()
	testenv.WaitFor(t, time.Minute, "the records applied", func() bool { return r.Stats().DB.Applied == n })
	testenv.WaitFor(t, time.Minute, "their offsets committed", func() bool { return k.CommittedAll(t, "ledger", topic) })
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the group empty", func() bool {
		gs, err := k.Admin().DescribeGroups(ctx, "ledger")
		return err == nil && gs["ledger"].State == "Empty"
	})
}

// A replay of a DB-scope consumer whose records are all applied reads a
// 100% expected no-op rate from its inbox; a critical consumer's replay
// needs --approve, and kscope audit shows who approved it.
func TestReplayNoOpRateAndApproval(t *testing.T) {
	bin := kscopeBinary(t)
	ctx := context.Background()
	k := testenv.KafkaT(t)
	url := testenv.DatabaseT(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (entry text)`); err != nil {
		t.Fatal(err)
	}
	const topic = "captures"
	createTopic(t, k, topic, 2)
	var recs []*kgo.Record
	for i := range 12 { // half with the producer's message id, half identified by their coordinates
		r := &kgo.Record{Topic: topic, Partition: int32(i % 2), Key: fmt.Appendf(nil, "acct-%d", i%3), Value: fmt.Appendf(nil, "capture-%d", i)}
		if i < 6 {
			r.Headers = []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: fmt.Appendf(nil, "msg-%d", i)}}
		}
		recs = append(recs, r)
	}
	produceTo(t, k, recs...)
	applyLedger(t, k, pool, topic, 12)
	file := writePolicy(t, ledgerPolicy)
	args := []string{"--policy", file, "replay", brokers(k), "--group", "ledger", "--topic", topic, "--to-start"}

	r := kscopeBin(t, bin, nil, append(args, "--dry-run", "--database-url", url)...)
	r.want(t, exitOK, "records:       12", "distinct keys: 3", "expected no-op rate: 100% (12 of 12 records read are in the inbox of consumer ledger, 12 of them applied: replaying them is a no-op)")
	r = kscopeBin(t, bin, []string{"DATABASE_URL=" + url}, append(args, "--dry-run", "--json")...)
	var rep replayReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || rep.Blast == nil || rep.Blast.NoOp == nil {
		t.Fatalf("--json: %v\n%s", err, r.stdout)
	}
	if n := rep.Blast.NoOp; n.Percent != 100 || n.InInbox != 12 || n.Applied != 12 || n.Identities != 12 || n.Consumer != "ledger" {
		t.Fatalf("no-op rate: %+v", n)
	}
	// Under another consumer's name, none is in the inbox.
	kscopeBin(t, bin, nil, append(args, "--dry-run", "--database-url", url, "--inbox-consumer", "other")...).want(t, exitOK, "expected no-op rate: 0% (0 of 12 records")
	// Without a database, the rate is unknown and the plan says how to get it.
	kscopeBin(t, bin, []string{"DATABASE_URL="}, append(args, "--dry-run")...).want(t, exitOK, "expected no-op rate: unknown: give --database-url")

	// Critical: a commit needs an approver.
	r = kscopeBin(t, bin, nil, append(args, "--yes", "--database-url", url)...)
	r.want(t, exitRefused, "kscope replay: refused: the policy "+file+" says critical: true for consumer group ledger (owned by payments, #payments-oncall): its replay needs an approver; nothing was changed",
		"Re-run with --approve NAME")
	if got, err := k.CommittedOffsets(ctx, "ledger", topic); err != nil || got[0] != 6 || got[1] != 6 {
		t.Fatalf("the refused replay moved the offsets: %v %v", got, err)
	}
	r = kscopeBin(t, bin, nil, append(args, "--yes", "--database-url", url, "--approve", "carol", "--reason", "rebuild the read model")...)
	r.want(t, exitOK, "committed: group ledger")
	es := auditEntries(t, bin, k, "ledger")
	if len(es) != 1 || es[0].ApprovedBy != "carol" || es[0].Reason != "rebuild the read model" || es[0].Forced || es[0].Blast.NoOp == nil || es[0].Blast.NoOp.Percent != 100 {
		t.Fatalf("audit log of ledger: %+v", es)
	}
	kscopeBin(t, bin, nil, "audit", brokers(k)).want(t, exitOK, "replay", "ledger", "captures", "carol", "rebuild the read model", "0:6->0 1:6->0")
	kscopeBin(t, bin, nil, "audit", brokers(k), "--group", "nobody").want(t, exitOK, "no entries in kscope-audit")
}

// Before any replay was audited, kscope audit says there is no log yet.
func TestAuditWithoutLog(t *testing.T) {
	k := testenv.KafkaT(t)
	kscope(t, "audit", brokers(k)).want(t, exitFailure, `topic "kscope-audit" does not exist: no replay was audited yet, or check --audit-topic`)
}
