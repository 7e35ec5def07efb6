package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

const paymentsPolicy = `version: 1
consumers:
  - group: payments
    scope: db
    owner: {team: payments, contact: "#payments-oncall"}
    replay: true
`

// dlt list and dlt show print each dead letter's owner: its kscope-owner
// header, else (with --policy) the policy's owner of its group, marked as
// such; without either, none.
func TestDLTListAndShowPrintTheOwner(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := setupDLT(t, k) // the fixture: no owner headers
	owned := dltRecord(dlt, dltEntry{partition: 1, key: "k9", value: "v9", attempt: 1, class: retrytopic.ClassTerminal, err: "rejected", origOff: 19})
	owned.Headers = append(owned.Headers, kgo.RecordHeader{Key: retrytopic.HeaderOwner, Value: []byte("ledger <ledger@example.com>")})
	produceTo(t, k, owned) // partition 1, offset 2
	bin := kscopeBinary(t)
	pol := writePolicy(t, paymentsPolicy)

	r := kscopeBin(t, bin, nil, "dlt", "list", brokers(k), "--group", testGroup, "--json", "--policy", pol)
	r.want(t, exitOK)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 6 {
		t.Fatalf("want 6 records, got:\n%s", r.stdout)
	}
	for _, line := range lines {
		var e listEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatal(err)
		}
		want, source := "payments <#payments-oncall>", ownerFromPolicy
		if e.Partition == 1 && e.Offset == 2 {
			want, source = "ledger <ledger@example.com>", ownerFromHeader
		}
		if e.Owner != want || e.OwnerSource != source {
			t.Errorf("%d/%d: owner %q from %q, want %q from %q", e.Partition, e.Offset, e.Owner, e.OwnerSource, want, source)
		}
	}

	// The table: an OWNER column, the policy's marked.
	r = kscopeBin(t, bin, nil, "--policy", pol, "dlt", "list", brokers(k), "--group", testGroup)
	r.want(t, exitOK, "OWNER", "payments <#payments-oncall> (policy)", "ledger <ledger@example.com>")

	// Without a policy file, a record without the header has no owner.
	r = kscopeBin(t, bin, nil, "dlt", "list", brokers(k), "--group", testGroup, "--json", "--partition", "0")
	r.want(t, exitOK)
	if strings.Contains(r.stdout, `"owner"`) {
		t.Fatalf("an owner without a header or a policy:\n%s", r.stdout)
	}

	r = kscopeBin(t, bin, nil, "dlt", "show", brokers(k), "--group", testGroup, "--partition", "1", "--offset", "2")
	r.want(t, exitOK, "owner:              ledger <ledger@example.com>")
	r = kscopeBin(t, bin, nil, "dlt", "show", brokers(k), "--group", testGroup, "--partition", "0", "--offset", "0", "--policy", pol)
	r.want(t, exitOK, "owner:              payments <#payments-oncall> (from the policy file")
}
