package main

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// kscope dlt delete (the built binary) refuses without an approver, prints
// what it would delete without --yes, and with it audits the identities
// (not the values), deletes the partition's prefix and commits the triage
// group past it.
func TestDLTDeleteNeedsAnApproverAndAuditsIdentities(t *testing.T) {
	bin := kscopeBinary(t)
	k := testenv.KafkaT(t)
	setupDLT(t, k)
	del := []string{"dlt", "delete", brokers(k), "--group", testGroup, "--partition", "0", "--before-offset", "2", "--reason", "test data, INC-77"}

	kscopeBin(t, bin, nil, del...).want(t, exitRefused, "refused: deleting dead letters loses them for good, so it needs an approver; nothing was deleted", "--approve NAME")
	del = append(del, "--approve", "alice")
	r := kscopeBin(t, bin, nil, del...)
	r.want(t, exitOK, "offsets 0 to 1: 2 records, 2 identities", "identities: ", "nothing deleted: re-run with --yes")
	if es := listJSON(t, k, "--group", testGroup); len(es) != 5 {
		t.Fatalf("a delete without --yes deleted records: %d left", len(es))
	}

	kscopeBin(t, bin, nil, append(del, "--yes")...).want(t, exitOK, "deleted 2 records of payments.kscope-dlt partition 0 before offset 2",
		"committed partition 0 offset 2 under group payments.kscope-triage")
	if got := coords(listJSON(t, k, "--group", testGroup)); got != "0/2 1/0 1/1" {
		t.Fatalf("records left: %s", got)
	}
	kscope(t, "dlt", "list", brokers(k), "--group", testGroup).want(t, exitOK, "3 waiting for triage")

	es := auditEntries(t, bin, k, testGroup)
	if len(es) != 1 || es[0].Action != actionDelete || es[0].ApprovedBy != "alice" || es[0].Reason != "test data, INC-77" || es[0].Payload != nil ||
		len(es[0].DeadLetters) != 2 || es[0].DeadLetters[0].Key != "k1" || es[0].DeadLetters[1].Key != "k2" || es[0].DeadLetters[1].ID == "" {
		t.Fatalf("audit log: %+v", es)
	}
	if out := kscopeBin(t, bin, nil, "audit", brokers(k), "--json").stdout; strings.Contains(out, `order\"`) || strings.Contains(out, "eyJvcmRlciI6") {
		t.Fatalf("the audit record holds the deleted values: %s", out)
	}
}

// In the at_least_once scope, kscope dlt skip remembers the identities in
// the group's dedupe store under the runner's key; in the Kafka scope it
// says what it cannot do. A redrive with an edited value refuses a
// skipped dead letter.
func TestDLTSkipRemembersInTheDedupeStore(t *testing.T) {
	bin := kscopeBinary(t)
	ctx := context.Background()
	k := testenv.KafkaT(t)
	url := testenv.DatabaseT(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := dedupe.NewPostgres(pool, dedupe.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	setupDLT(t, k)
	es := listJSON(t, k, "--group", testGroup, "--key", "k1")
	if len(es) != 2 {
		t.Fatalf("fixture: %+v", es)
	}
	policyFile := writePolicy(t, `version: 1
consumers:
  - group: payments
    scope: at_least_once
    dedupe: postgres
    replay: true
    owner: {team: payments, contact: "#payments-oncall"}
`)
	kscopeBin(t, bin, []string{"DATABASE_URL=" + url}, "--policy", policyFile, "dlt", "skip", brokers(k), "--group", testGroup, "--key", "k1", "--reason", "order cancelled").
		want(t, exitOK, "skipped partition 0 offset 0 (key k1", "skipped partition 1 offset 1 (key k1", "2 identities remembered in the postgres dedupe store of group payments")
	prefix := strconv.Itoa(len(testGroup)) + ":" + testGroup + ":"
	seen, err := store.Seen(ctx, []string{prefix + es[0].ID, prefix + es[1].ID, prefix + "other"})
	if err != nil || !seen[0] || !seen[1] || seen[2] {
		t.Fatalf("dedupe store: %v %v", seen, err)
	}

	kscopeBin(t, bin, nil, "dlt", "skip", brokers(k), "--group", testGroup, "--partition", "0", "--offset", "1", "--reason", "duplicate order", "--scope", "kafka").
		want(t, exitOK, "skipped partition 0 offset 1 (key k2", "the Kafka scope keeps no dedupe state kscope can write: a replay of the source topic handles these records again",
			"committed partition 0 offset 2 under group payments.kscope-triage")
	file := writePolicy(t, "edited")
	kscopeBin(t, bin, nil, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "source", "--partition", "1", "--offset", "1", "--payload-file", file, "--reason", "r").
		want(t, exitRefused, "was skipped by kscope dlt skip")
}
