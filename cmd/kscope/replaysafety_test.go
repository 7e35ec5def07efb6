package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/testenv"
)

// commitOn commits offsets of topic for group, which has no members.
func commitOn(t *testing.T, k *testenv.Kafka, group, topic string, at map[int32]int64) {
	t.Helper()
	offs := make(kadm.Offsets)
	for p, o := range at {
		offs.Add(kadm.Offset{Topic: topic, Partition: p, At: o, LeaderEpoch: -1})
	}
	if err := k.Admin().CommitAllOffsets(context.Background(), group, offs); err != nil {
		t.Fatal(err)
	}
}

// auditEntries runs kscope audit --json (of group, when not "") and
// decodes its lines.
func auditEntries(t *testing.T, bin string, k *testenv.Kafka, group string) []auditRecord {
	t.Helper()
	args := []string{"audit", brokers(k), "--json"}
	if group != "" {
		args = append(args, "--group", group)
	}
	r := kscopeBin(t, bin, nil, args...)
	r.want(t, exitOK)
	var out []auditRecord
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if l == "" {
			continue
		}
		var a auditRecord
		if err := json.Unmarshal([]byte(l), &a); err != nil {
			t.Fatalf("kscope audit --json: %v\n%s", err, r.stdout)
		}
		out = append(out, a)
	}
	return out
}

const emailsPolicy = `version: 1
consumers:
  - group: emails
    scope: at_least_once
    owner: {team: growth, contact: "#growth-oncall"}
    replay: true
  - group: cached
    scope: at_least_once
    owner: {team: growth, contact: "#growth-oncall"}
    replay: true
    dedupe: memory
`

// An at_least_once consumer without a dedupe store that outlives its
// processes is refused a replay that moves it back, with exit status 2 and
// a sentence that says why, the blast radius printed; --force needs a
// reason, and with one the replay goes on and is audited; a move forward
// runs nothing again and is not refused.
func TestReplayRefusesAtLeastOnceWithoutDedupe(t *testing.T) {
	bin := kscopeBinary(t)
	k := testenv.KafkaT(t)
	setupReplay(t, k)
	commit(t, k, "emails", map[int32]int64{0: 8, 1: 6})
	commit(t, k, "cached", map[int32]int64{0: 8, 1: 6})
	file := writePolicy(t, emailsPolicy)
	replayArgs := func(group string, more ...string) []string {
		return append([]string{"--policy", file, "replay", brokers(k), "--group", group, "--topic", testSource}, more...)
	}

	r := kscopeBin(t, bin, nil, replayArgs("emails", "--to-start", "--yes")...)
	r.want(t, exitRefused, "kscope replay: refused: consumer group emails runs in the at_least_once scope without a dedupe store that outlives its processes (the policy "+file+
		" declares no dedupe store): the replay would run its handler again for 14 records, and their effects would happen twice; nothing was changed",
		`Re-run with --force --reason "..."`, "blast radius:", "records:       14")
	kscopeBin(t, bin, nil, replayArgs("cached", "--to-start", "--dry-run")...).want(t, exitRefused, "(the policy "+file+" says dedupe: memory)")
	kscopeBin(t, bin, nil, replayArgs("emails", "--to-start", "--yes", "--force")...).want(t, exitUsage, `--force needs --reason "..."`)
	if got := committed(t, k, "emails"); got != "0:8 1:6" {
		t.Fatalf("a refused replay moved the offsets: %s", got)
	}

	r = kscopeBin(t, bin, []string{"USER=oncall"}, replayArgs("emails", "--to-start", "--yes", "--force", "--reason", "the mailer was down; resend", "--approve", "alice")...)
	r.want(t, exitOK, "committed: group emails", "audit log entry")
	if got := committed(t, k, "emails"); got != "0:0 1:0" {
		t.Fatalf("the forced replay: %s", got)
	}
	// Forward: nothing runs again, no dedupe store needed.
	kscopeBin(t, bin, nil, replayArgs("emails", "--to-end", "--yes")...).want(t, exitOK, "committed")

	es := auditEntries(t, bin, k, "emails")
	if len(es) != 2 {
		t.Fatalf("audit log of emails: %d entries, want 2: %+v", len(es), es)
	}
	a := es[0]
	if a.Action != "replay" || a.ApprovedBy != "alice" || a.Operator != "oncall" || !a.Forced || a.Reason != "the mailer was down; resend" ||
		a.Topic != testSource || a.What != "the start of the log" || a.Again != 14 || a.Blast == nil || a.Blast.Records != 14 {
		t.Fatalf("the forced replay's audit entry: %+v", a)
	}
	if got := fmt.Sprint(a.Ranges); got != "[{0 8 0} {1 6 0}]" {
		t.Fatalf("ranges %s", got)
	}
	if es[1].Forced || es[1].Skipped != 16 {
		t.Fatalf("the forward replay's audit entry: %+v", es[1])
	}
	kscopeBin(t, bin, nil, "audit", brokers(k), "--group", "emails").want(t, exitOK, "APPROVED BY", "alice", "oncall", "the mailer was down; resend", "0:8->0 1:6->0")
}

// The blast radius counts the records a replay gives again, their
// distinct keys and their time range, reading at most --max-scan records:
// past it, the counts are lower bounds and say so.
func TestReplayBlastRadius(t *testing.T) {
	bin := kscopeBinary(t)
	k := testenv.KafkaT(t)
	const topic = "signups"
	createTopic(t, k, topic, 2)
	var recs []*kgo.Record
	for i := range 10 { // partition 0: keys k0..k3
		recs = append(recs, &kgo.Record{Topic: topic, Partition: 0, Key: fmt.Appendf(nil, "k%d", i%4), Timestamp: replayBase.Add(time.Duration(i) * time.Minute)})
	}
	for i := range 6 { // partition 1: key k9 on odd offsets, none on even ones
		r := &kgo.Record{Topic: topic, Partition: 1, Timestamp: replayBase.Add(time.Duration(i) * time.Minute)}
		if i%2 == 1 {
			r.Key = []byte("k9")
		}
		recs = append(recs, r)
	}
	produceTo(t, k, recs...)
	commitOn(t, k, "signups", topic, map[int32]int64{0: 8, 1: 6})

	// Offsets 2 to 7 of partition 0 and 2 to 5 of partition 1.
	r := kscopeBin(t, bin, nil, "replay", brokers(k), "--group", "signups", "--topic", topic, "--to-offset", "2", "--dry-run")
	r.want(t, exitOK, "blast radius:\n", "records:       10\n", "distinct keys: 5 (and 2 records without a key)\n",
		"time range:    2024-05-01T00:02:00Z to 2024-05-01T00:07:00Z\n", "dry run: nothing changed")

	r = kscopeBin(t, bin, nil, "replay", brokers(k), "--group", "signups", "--topic", topic, "--to-offset", "2", "--max-scan", "3", "--json")
	var rep replayReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || rep.Blast == nil {
		t.Fatalf("--json: %v\n%s", err, r.stdout)
	}
	b := rep.Blast
	if b.Records != 3 || b.Keys != 3 || !b.LowerBounds || b.Offsets != 10 || b.MaxScan != 3 ||
		!b.First.Equal(replayBase.Add(2*time.Minute)) || !b.Last.Equal(replayBase.Add(4*time.Minute)) {
		t.Fatalf("blast radius past --max-scan: %+v", b)
	}
	kscopeBin(t, bin, nil, "replay", brokers(k), "--group", "signups", "--topic", topic, "--to-offset", "2", "--max-scan", "3").
		want(t, exitOK, "lower bounds: --max-scan 3 reached before the 10 offsets to replay were read", "records:       at least 3")
	kscopeBin(t, bin, nil, "replay", brokers(k), "--group", "signups", "--topic", topic, "--to-start", "--max-scan", "0").want(t, exitUsage, "--max-scan must be 1 or more")
	// A move forward gives nothing again: no blast radius to read.
	r = kscopeBin(t, bin, nil, "replay", brokers(k), "--group", "signups", "--topic", topic, "--to-end", "--dry-run")
	r.want(t, exitOK, "records skipped")
	if strings.Contains(r.stdout, "blast radius") {
		t.Fatalf("a move forward printed a blast radius:\n%s", r.stdout)
	}
}
