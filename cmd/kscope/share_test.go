package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

const shareTopic, shareGroup = "work", "workers"

// shareKafka is a Kafka whose share-group members join within 100ms (on
// Apache Kafka, internal/testenv's brokers are set up alike).
func shareKafka(t *testing.T) *testenv.Kafka {
	return testenv.KafkaT(t, kfake.BrokerConfigs(map[string]string{
		"group.share.heartbeat.interval.ms":   "100",
		"share.record.lock.sweep.interval.ms": "100",
	}))
}

// shareRunner is a running member of the share group: it counts the
// records it was given, by value.
type shareRunner struct {
	r    *consumer.Runner
	mu   sync.Mutex
	seen map[string]int
	stop func() error
}

func (m *shareRunner) handled() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, c := range m.seen {
		n += c
	}
	return n
}

// startShareMember runs a member of shareGroup on shareTopic.
func startShareMember(t *testing.T, k *testenv.Kafka) *shareRunner {
	t.Helper()
	m := &shareRunner{seen: map[string]int{}}
	cfg := consumer.Config{Brokers: k.Brokers, Group: shareGroup, Topics: []string{shareTopic}, ClientOptions: []kgo.Opt{kgo.ClientID("share-member")},
		DrainTimeout: 5 * time.Second, Share: &consumer.ShareConfig{}, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, rec *consumer.Record) error {
		m.mu.Lock()
		m.seen[string(rec.Value)]++
		m.mu.Unlock()
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	m.r = r
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var once sync.Once
	m.stop = func() error {
		once.Do(func() { cancel(); err = <-errc })
		return err
	}
	t.Cleanup(func() { m.stop() })
	return m
}

// describeShareJSON runs kscope share describe --json.
func describeShareJSON(t *testing.T, k *testenv.Kafka) shareDescription {
	t.Helper()
	r := kscope(t, "share", "describe", brokers(k), "--group", shareGroup, "--json")
	r.want(t, exitOK)
	var d shareDescription
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil {
		t.Fatalf("share describe --json: %v\n%s", err, r.stdout)
	}
	return d
}

// starts returns a description's start offsets, as "p:start p:start".
func (d shareDescription) starts() string {
	s := ""
	for i, p := range d.Partitions {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%d:%d", p.Partition, p.Start)
	}
	return s
}

// setupShare has a member of shareGroup run, writes 10 records to
// partition 0 and 6 to partition 1 of shareTopic, and waits until the
// member handled and accepted them all. The records are written once the
// member is ready: the runner sets the group's start
// (share.auto.offset.reset) once its client runs, and a partition the
// group started before is started at its end.
func setupShare(t *testing.T, k *testenv.Kafka) *shareRunner {
	t.Helper()
	createTopic(t, k, shareTopic, 2)
	m := startShareMember(t, k)
	testenv.WaitFor(t, 30*time.Second, "the member ready", func() bool { return m.r.Health().Ready })
	var recs []*kgo.Record
	for p, n := range []int{10, 6} {
		for i := range n {
			recs = append(recs, &kgo.Record{Topic: shareTopic, Partition: int32(p), Value: fmt.Appendf(nil, "%d-%d", p, i), Timestamp: replayBase.Add(time.Duration(i) * time.Minute)})
		}
	}
	produceTo(t, k, recs...)
	testenv.WaitFor(t, time.Minute, "the member to accept every record", func() bool {
		return m.handled() >= 16 && m.r.Stats().Share.Accepted >= 16
	})
	return m
}

// share describe shows a running share group's member, with its client
// id and the partitions assigned to it, and per partition the start
// offset, the end offset and the backlog between them; it says that the
// broker does not report the records in flight.
func TestShareDescribe(t *testing.T) {
	k := shareKafka(t)
	setupShare(t, k)
	var d shareDescription
	testenv.WaitFor(t, 30*time.Second, "the backlog empty", func() bool {
		d = describeShareJSON(t, k)
		return d.Backlog == 0 && len(d.Partitions) == 2
	})
	if d.State != "Stable" || len(d.Members) != 1 || d.Members[0].ClientID != "share-member" || d.Backlog != 0 {
		t.Fatalf("share describe: %+v", d)
	}
	if got := fmt.Sprint(d.Members[0].Assigned); got != "[work[0] work[1]]" {
		t.Fatalf("assigned %s", got)
	}
	for i, p := range d.Partitions {
		if p.Partition != int32(i) || p.End != []int64{10, 6}[i] || p.Backlog != 0 || p.Topic != shareTopic {
			t.Fatalf("partition %+v", p)
		}
	}
	kscope(t, "share", "describe", brokers(k), "--group", shareGroup).want(t, exitOK,
		"share group workers: state Stable, 1 member", "MEMBER ID", "share-member", "work[0] work[1]",
		"TOPIC", "START OFFSET", "END OFFSET", "BACKLOG", "backlog: 0 records not yet acknowledged", "in flight and delivery counts: not reported by the broker")

	kscope(t, "share", "describe", brokers(k), "--group", "nobody").want(t, exitFailure, `share group "nobody" does not exist`)
	commitOn(t, k, "classic", shareTopic, map[int32]int64{0: 1})
	kscope(t, "share", "describe", brokers(k), "--group", "classic").want(t, exitFailure, `group "classic" is a consumer group (state Empty), not a share group: 'kscope replay' moves its offsets`)
	kscope(t, "share", "describe", brokers(k)).want(t, exitUsage, "give the share group with --group")
}

const sharePolicy = `version: 1
consumers:
  - group: workers
    scope: at_least_once
    owner: {team: ops, contact: "#ops-oncall"}
    replay: true
    critical: true
    dedupe: redis
  - group: frozen
    scope: db
    owner: {team: ledger, contact: "#ledger-oncall"}
    replay: false
`

// share reset refuses a share group with members (exit 2, nothing
// moved), prints the blast radius and asks for --yes, follows the
// policy's rules as replay does (replay: false, critical: true without
// --approve), and with --yes moves the start offsets, audited: the
// group's next member is given the records from there again.
func TestShareReset(t *testing.T) {
	bin := kscopeBinary(t)
	k := shareKafka(t)
	m := setupShare(t, k)
	file := writePolicy(t, sharePolicy)
	args := func(more ...string) []string {
		return append([]string{"--policy", file, "share", "reset", brokers(k), "--group", shareGroup, "--topic", shareTopic}, more...)
	}
	testenv.WaitFor(t, 30*time.Second, "the backlog empty", func() bool { return describeShareJSON(t, k).Backlog == 0 })

	r := kscopeBin(t, bin, nil, args("--to-start", "--yes", "--approve", "alice")...)
	r.want(t, exitRefused, `kscope share reset: refused: share group "workers" has members (state Stable, 1 member: share-member@`, "stop its consumers first")
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the member to leave", func() bool { return len(describeShareJSON(t, k).Members) == 0 })

	kscopeBin(t, bin, nil, args("--to-start")...).want(t, exitOK, "share reset: group workers, topic work, to the start of the log",
		"allows a replay", "POSITION", "10 records given again", "6 records given again", "total: 16 records given again, 0 records skipped",
		"blast radius:", "records:       16", "nothing changed: re-run with --yes")
	kscopeBin(t, bin, nil, args("--to-start", "--yes")...).want(t, exitRefused, "says critical: true for consumer group workers", "needs an approver")
	kscopeBin(t, bin, nil, "--policy", file, "share", "reset", brokers(k), "--group", "frozen", "--topic", shareTopic, "--to-start").
		want(t, exitRefused, "says replay: false for consumer group frozen")
	kscopeBin(t, bin, nil, args("--to-offset", "2", "--partition", "5")...).want(t, exitUsage, "topic work has no partition 5: it has 2 partitions")
	kscopeBin(t, bin, nil, args()...).want(t, exitUsage, "give exactly one target")
	kscopeBin(t, bin, nil, "share", "reset", brokers(k), "--group", "nobody", "--topic", shareTopic, "--to-start").
		want(t, exitRefused, `share group "nobody" does not exist`, "nothing was changed")
	if d := describeShareJSON(t, k); d.Backlog != 0 {
		t.Fatalf("a refused or unconfirmed reset moved the start offsets: %+v", d)
	}

	kscopeBin(t, bin, []string{"USER=oncall"}, args("--to-start", "--yes", "--approve", "alice", "--reason", "the handler was broken")...).
		want(t, exitOK, "moved: share group workers will start topic work at the target offsets on 2 partitions", "audit log entry")
	kscopeBin(t, bin, nil, args("--to-offset", "3", "--partition", "1", "--yes", "--approve", "alice")...).
		want(t, exitOK, "on 1 partition")
	d := describeShareJSON(t, k)
	if got := d.starts(); got != "0:0 1:3" || d.Backlog != 13 {
		t.Fatalf("after the resets: start offsets %s, backlog %d; want 0:0 1:3, 13", got, d.Backlog)
	}
	es := auditEntries(t, bin, k, shareGroup)
	if len(es) != 2 {
		t.Fatalf("audit log: %d entries, want 2: %+v", len(es), es)
	}
	a := es[0]
	if a.Action != "share-reset" || a.ApprovedBy != "alice" || a.Operator != "oncall" || a.Reason != "the handler was broken" || a.Again != 16 ||
		fmt.Sprint(a.Ranges) != "[{0 10 0} {1 6 0}]" {
		t.Fatalf("the reset's audit entry: %+v", a)
	}
	if fmt.Sprint(es[1].Ranges) != "[{1 0 3}]" {
		t.Fatalf("the second reset's ranges: %+v", es[1].Ranges)
	}

	// The next member is given the records from the new start offsets.
	m2 := startShareMember(t, k)
	testenv.WaitFor(t, time.Minute, "the member to be given the records again", func() bool { return m2.handled() >= 13 })
	testenv.WaitFor(t, 30*time.Second, "the records accepted", func() bool { return describeShareJSON(t, k).Backlog == 0 })
	if n := m2.handled(); n != 13 {
		t.Fatalf("the member after the resets handled %d records, want 13", n)
	}
}
