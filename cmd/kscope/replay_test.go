package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/testenv"
)

var replayBase = time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC)

// setupReplay creates topic "orders" with 10 records on partition 0 and 6
// on partition 1, record i stamped replayBase + i minutes, and commits
// offsets 8 and 6 for group "billing", which has no members.
func setupReplay(t *testing.T, k *testenv.Kafka) {
	t.Helper()
	createTopic(t, k, testSource, 2)
	var recs []*kgo.Record
	for p, n := range []int{10, 6} {
		for i := range n {
			recs = append(recs, &kgo.Record{Topic: testSource, Partition: int32(p), Value: fmt.Appendf(nil, "%d-%d", p, i), Timestamp: replayBase.Add(time.Duration(i) * time.Minute)})
		}
	}
	produceTo(t, k, recs...)
	commit(t, k, "billing", map[int32]int64{0: 8, 1: 6})
}

func commit(t *testing.T, k *testenv.Kafka, group string, at map[int32]int64) {
	t.Helper()
	offs := make(kadm.Offsets)
	for p, o := range at {
		offs.Add(kadm.Offset{Topic: testSource, Partition: p, At: o, LeaderEpoch: -1})
	}
	if err := k.Admin().CommitAllOffsets(context.Background(), group, offs); err != nil {
		t.Fatal(err)
	}
}

func committed(t *testing.T, k *testenv.Kafka, group string) string {
	t.Helper()
	m, err := k.CommittedOffsets(context.Background(), group, testSource)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("0:%d 1:%d", m[0], m[1])
}

// planRows returns the report's rows as "partition committed target"
// followed by the effect.
func planRows(out string) []string {
	var rows []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && (f[0] == "0" || f[0] == "1") {
			rows = append(rows, strings.Join(f, " "))
		}
	}
	return rows
}

func TestReplayDryRunReport(t *testing.T) {
	k := testenv.KafkaT(t)
	setupReplay(t, k)
	r := kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-offset", "2", "--dry-run")
	r.want(t, exitOK, "replay: group billing, topic orders, to offset 2", "PARTITION  COMMITTED  TARGET  EFFECT",
		"total: 10 records consumed again, 0 records skipped", "dry run: nothing changed")
	if got, want := strings.Join(planRows(r.stdout), "|"), "0 8 2 6 records consumed again|1 6 2 4 records consumed again"; got != want {
		t.Fatalf("rows %q, want %q", got, want)
	}
	if got := committed(t, k, "billing"); got != "0:8 1:6" {
		t.Fatalf("dry run changed the offsets: %s", got)
	}

	// Moving forward skips; an offset past the end is clamped.
	r = kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-offset", "9", "--dry-run")
	r.want(t, exitOK, "total: 0 records consumed again, 1 record skipped")
	if got, want := strings.Join(planRows(r.stdout), "|"), "0 8 9 1 record skipped|1 6 6 (clamped) unchanged"; got != want {
		t.Fatalf("rows %q, want %q", got, want)
	}

	// By time: the first record at or after 00:05 is offset 5 on both.
	r = kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-time", "2024-05-01T00:05:00Z", "--dry-run")
	r.want(t, exitOK, "to the first record at or after 2024-05-01T00:05:00Z", "total: 4 records consumed again, 0 records skipped")
	if got, want := strings.Join(planRows(r.stdout), "|"), "0 8 5 3 records consumed again|1 6 5 1 record consumed again"; got != want {
		t.Fatalf("rows %q, want %q", got, want)
	}
	// A time after every record: the end.
	r = kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-time", "2030-01-01T00:00:00+02:00", "--dry-run")
	r.want(t, exitOK, "total: 0 records consumed again, 2 records skipped")

	// Without --yes nothing changes either.
	r = kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-start")
	r.want(t, exitOK, "total: 14 records consumed again", "re-run with --yes")
	if got := committed(t, k, "billing"); got != "0:8 1:6" {
		t.Fatalf("replay without --yes changed the offsets: %s", got)
	}
}

func TestReplayCommits(t *testing.T) {
	k := testenv.KafkaT(t)
	setupReplay(t, k)
	kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-start", "--yes").
		want(t, exitOK, "total: 14 records consumed again", "committed: group billing will start topic orders at the target offsets on 2 partitions")
	if got := committed(t, k, "billing"); got != "0:0 1:0" {
		t.Fatalf("after --to-start: %s", got)
	}
	kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-time", "2024-05-01T00:03:00Z", "--yes").
		want(t, exitOK, "total: 0 records consumed again, 6 records skipped")
	if got := committed(t, k, "billing"); got != "0:3 1:3" {
		t.Fatalf("after --to-time: %s", got)
	}
	kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-end", "--yes").
		want(t, exitOK, "total: 0 records consumed again, 10 records skipped")
	if got := committed(t, k, "billing"); got != "0:10 1:6" {
		t.Fatalf("after --to-end: %s", got)
	}
	kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-end", "--yes").
		want(t, exitOK, "nothing to do")

	// A partition without a committed offset is moved too.
	commit(t, k, "half", map[int32]int64{0: 4})
	r := kscope(t, "replay", brokers(k), "--group", "half", "--topic", testSource, "--to-offset", "1", "--yes")
	r.want(t, exitOK, "none", "no committed offset yet", "1 partition without a committed offset")
	if got := committed(t, k, "half"); got != "0:1 1:1" {
		t.Fatalf("after --to-offset 1: %s", got)
	}
}

func TestReplayRefusesActiveGroup(t *testing.T) {
	k := testenv.KafkaT(t)
	setupReplay(t, k)
	commit(t, k, "live", map[int32]int64{0: 7, 1: 5})

	cl, err := k.Client(kgo.ConsumerGroup("live"), kgo.ConsumeTopics(testSource), kgo.DisableAutoCommit(), kgo.ClientID("live-consumer"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			cl.PollFetches(ctx)
		}
	}()
	defer func() {
		cancel()
		wg.Wait()
		cl.Close()
	}()
	waitFor(t, "the consumer to join group live", func() (bool, error) {
		gs, err := k.Admin().DescribeGroups(context.Background(), "live")
		if err != nil {
			return false, err
		}
		g := gs["live"]
		return g.State == "Stable" && len(g.Members) == 1, g.Err
	})

	for _, extra := range []string{"--yes", "--dry-run"} {
		r := kscope(t, "replay", brokers(k), "--group", "live", "--topic", testSource, "--to-start", extra)
		r.want(t, exitFailure, `consumer group "live" is still active`, "1 members: live-consumer@", "stop its consumers first")
		if strings.Contains(r.stdout, "PARTITION") {
			t.Fatalf("printed a plan for an active group:\n%s", r.stdout)
		}
	}
	if got := committed(t, k, "live"); got != "0:7 1:5" {
		t.Fatalf("offsets of the active group changed: %s", got)
	}
}

func TestReplayRefusals(t *testing.T) {
	k := testenv.KafkaT(t)
	setupReplay(t, k)
	kscope(t, "replay", brokers(k), "--group", "ghost", "--topic", testSource, "--to-start", "--yes").
		want(t, exitFailure, `consumer group "ghost" does not exist`, "check --group")
	kscope(t, "replay", brokers(k), "--group", "billing", "--topic", "nope", "--to-start", "--yes").
		want(t, exitFailure, `topic "nope" does not exist`, "check --topic")

	kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource).want(t, exitUsage, "exactly one target")
	kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-start", "--to-end").want(t, exitUsage, "exactly one target")
	kscope(t, "replay", brokers(k), "--topic", testSource, "--to-start").want(t, exitUsage, "--group")
	kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-time", "yesterday").want(t, exitUsage, "not an RFC 3339 time")
	if got := committed(t, k, "billing"); got != "0:8 1:6" {
		t.Fatalf("offsets changed: %s", got)
	}
}

// --json: the plan and the outcome as one JSON object.
func TestReplayJSON(t *testing.T) {
	k := testenv.KafkaT(t)
	setupReplay(t, k)
	var rep struct {
		Partitions []struct {
			Partition int32 `json:"partition"`
			Committed int64 `json:"committed"`
			Target    int64 `json:"target"`
		} `json:"partitions"`
		Again       int64  `json:"records_consumed_again"`
		Committed   bool   `json:"committed"`
		Explanation string `json:"explanation"`
	}
	r := kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-start", "--json")
	r.want(t, exitOK)
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || len(rep.Partitions) != 2 || rep.Again != 14 || rep.Committed ||
		!strings.Contains(rep.Explanation, "nothing changed") {
		t.Fatalf("without --yes: %v, %+v\n%s", err, rep, r.stdout)
	}
	r = kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-start", "--json", "--yes")
	r.want(t, exitOK)
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || !rep.Committed {
		t.Fatalf("with --yes: %v, %+v\n%s", err, rep, r.stdout)
	}
}

// A replay that moves offsets back says what each scope will and will not
// handle again: the report's "consumed again" counts offsets, while a
// DB-scope runner with StoreOffsets resumes from its stored positions and
// consumes none of them, and the inbox makes the others no-ops.
func TestReplayReportSaysWhatIsHandledAgain(t *testing.T) {
	k := testenv.KafkaT(t)
	setupReplay(t, k)
	notes := []string{
		"what is handled again depends on the group's scope",
		"at-least-once: the handler runs again",
		"DB scope: a record whose inbox row is kept is a no-op",
		"rows InboxTTL deleted are applied again",
		"dbscope.Options.StoreOffsets",
		"consumes none of them",
		"offsets WHERE consumer",
		"Kafka scope: the outputs are produced again",
	}
	r := kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-offset", "2", "--dry-run")
	r.want(t, exitOK, notes...)

	var rep struct {
		Again int64  `json:"records_consumed_again"`
		Note  string `json:"handled_again"`
	}
	r = kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-start", "--json")
	r.want(t, exitOK)
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || rep.Again != 14 || !strings.Contains(rep.Note, "StoreOffsets") {
		t.Fatalf("--json: %+v, %v\n%s", rep, err, r.stdout)
	}

	// Moving forward only skips: no note.
	r = kscope(t, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-end", "--dry-run")
	r.want(t, exitOK, "skipped")
	if strings.Contains(r.stdout, "handled again") {
		t.Fatalf("a skip-only replay carries the note:\n%s", r.stdout)
	}
}
