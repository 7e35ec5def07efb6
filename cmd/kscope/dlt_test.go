package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

const (
	testGroup  = "payments"
	testSource = "orders"
)

var failedAt = time.Date(2024, 5, 1, 12, 30, 0, 0, time.UTC)

// dltEntry describes one record of the test dead-letter topic.
type dltEntry struct {
	partition int32
	key       string
	value     string
	attempt   int
	class     retrytopic.Class
	err       string
	origPart  int32
	origOff   int64
	extra     []kgo.RecordHeader // the original record's own headers
	spring    bool
}

// fixture is the test dead-letter topic of group "payments" with records
// as kscope's router writes them: partition 0 offsets 0-2, partition 1
// offsets 0-1.
var fixture = []dltEntry{
	{partition: 0, key: "k1", value: `{"order":1}`, attempt: 3, class: retrytopic.ClassRetryable, err: "db down", origPart: 0, origOff: 10},
	{partition: 0, key: "k2", value: `{"order":2}`, attempt: 1, class: retrytopic.ClassTerminal, err: "decode: bad json", origPart: 1, origOff: 11},
	{partition: 0, key: "k3", value: `{"order":3}`, attempt: 5, class: retrytopic.ClassRetryable,
		err: "timeout\ncalling the ledger service " + strings.Repeat("and waiting ", 20), origPart: 0, origOff: 12, spring: true},
	{partition: 1, key: "k4", value: "payload four\nline two", attempt: 2, class: retrytopic.ClassUnknown, err: "boom", origPart: 1, origOff: 13,
		extra: []kgo.RecordHeader{{Key: "message-id", Value: []byte("m-4")}, {Key: "trace-bin", Value: []byte{0x00, 0xff, 0x10}}}},
	{partition: 1, key: "k1", value: `{"order":5}`, attempt: 1, class: retrytopic.ClassTerminal, err: "validation: amount < 0", origPart: 0, origOff: 14},
}

// dltRecord builds the record kscope's router writes to a dead-letter
// topic for e.
func dltRecord(topic string, e dltEntry) *kgo.Record {
	m := retrytopic.Metadata{
		OriginalTopic:     testSource,
		OriginalPartition: e.origPart,
		OriginalOffset:    e.origOff,
		OriginalTimestamp: failedAt.Add(-time.Hour),
		Group:             testGroup,
		Attempt:           e.attempt,
		FirstFailure:      failedAt.Add(-time.Minute),
		LastFailure:       failedAt,
		Error:             e.err,
		Class:             e.class,
		Stage:             -1,
	}
	orig := &kgo.Record{Topic: testSource, Partition: e.origPart, Offset: e.origOff, Headers: e.extra}
	m.ID = consumer.Identity{}.Of(&consumer.Record{Record: orig})
	return &kgo.Record{
		Topic:     topic,
		Partition: e.partition,
		Key:       []byte(e.key),
		Value:     []byte(e.value),
		Headers:   m.Headers(e.extra, e.spring),
	}
}

// setupDLT creates the source topic and group payments' dead-letter topic
// holding the fixture, and returns the latter's name.
func setupDLT(t *testing.T, k *testenv.Kafka) string {
	t.Helper()
	dlt := retrytopic.DLTopic(testGroup)
	createTopic(t, k, testSource, 2)
	createTopic(t, k, dlt, 2)
	var recs []*kgo.Record
	for _, e := range fixture {
		recs = append(recs, dltRecord(dlt, e))
	}
	produceTo(t, k, recs...)
	return dlt
}

func listJSON(t *testing.T, k *testenv.Kafka, args ...string) []listEntry {
	t.Helper()
	r := kscope(t, append([]string{"dlt", "list", brokers(k), "--json"}, args...)...)
	r.want(t, exitOK)
	var out []listEntry
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if line == "" {
			continue
		}
		var e listEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("line %q is not JSON: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

// coords renders entries as "partition/offset" in order.
func coords(es []listEntry) string {
	var s []string
	for _, e := range es {
		s = append(s, fmt.Sprintf("%d/%d", e.Partition, e.Offset))
	}
	return strings.Join(s, " ")
}

func TestDLTListTable(t *testing.T) {
	k := testenv.KafkaT(t)
	setupDLT(t, k)
	r := kscope(t, "dlt", "list", brokers(k), "--group", testGroup)
	r.want(t, exitOK, "PARTITION", "OFFSET", "KEY", "ATTEMPT", "CLASS", "LAST FAILURE", "ORIGINAL", "OWNER", "ERROR", "5 records in payments.kscope-dlt",
		"5 waiting for triage")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 8 { // header, 5 rows, count, waiting
		t.Fatalf("want a header, 5 rows, a count and the waiting, got:\n%s", r.stdout)
	}
	first := strings.Fields(lines[1])
	if want := []string{"0", "0", "k1", "3", "retryable", "2024-05-01T12:30:00.000Z", "orders/0/10", "-", "db", "down"}; strings.Join(first, " ") != strings.Join(want, " ") {
		t.Fatalf("first row %q, want %q", first, want)
	}
	// The long, multi-line error is escaped and cut to one cell.
	third := lines[3]
	if !strings.Contains(third, `timeout\ncalling the ledger`) || !strings.HasSuffix(third, "…") || strings.Contains(third, "and waiting and waiting and waiting and waiting and waiting") {
		t.Fatalf("long error not cut to one line: %q", third)
	}
	if !strings.HasPrefix(lines[4], "1 ") || !strings.Contains(lines[4], "orders/1/13") || !strings.Contains(lines[4], "unknown") {
		t.Fatalf("partition 1 row wrong: %q", lines[4])
	}
}

func TestDLTListJSONAndFilters(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := setupDLT(t, k)

	all := listJSON(t, k, "--topic", dlt)
	if got := coords(all); got != "0/0 0/1 0/2 1/0 1/1" {
		t.Fatalf("listed %s", got)
	}
	e := all[3]
	if e.Key == nil || *e.Key != "k4" || e.Attempt != 2 || e.Class != "unknown" || e.Error != "boom" ||
		e.OriginalTopic != testSource || e.OriginalPartition != 1 || e.OriginalOffset != 13 ||
		e.ID != "m-4" || e.Group != testGroup || e.LastFailure != "2024-05-01T12:30:00.000Z" || e.Topic != dlt {
		t.Fatalf("record 1/0 decoded as %+v", e)
	}
	if all[2].Error != fixture[2].err {
		t.Fatalf("--json cut the error: %q", all[2].Error)
	}
	if all[0].ID != "orders/0/10" {
		t.Fatalf("identity of a record without message-id: %q, want its original coordinates", all[0].ID)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--partition", "1"}, "1/0 1/1"},
		{[]string{"--from-offset", "1"}, "0/1 0/2 1/1"},
		{[]string{"--to-offset", "0"}, "0/0 1/0"},
		{[]string{"--from-offset", "1", "--to-offset", "1"}, "0/1 1/1"},
		{[]string{"--partition", "0", "--from-offset", "1", "--to-offset", "5"}, "0/1 0/2"},
		{[]string{"--key", "k1"}, "0/0 1/1"},
		{[]string{"--class", "terminal"}, "0/1 1/1"},
		{[]string{"--class", "retryable", "--partition", "0", "--from-offset", "2"}, "0/2"},
		{[]string{"--key", "k1", "--class", "retryable"}, "0/0"},
		{[]string{"--id", "m-4"}, "1/0"},
		{[]string{"--key", "nope"}, ""},
		{[]string{"--from-offset", "7"}, ""},
	} {
		got := coords(listJSON(t, k, append([]string{"--group", testGroup}, c.args...)...))
		if got != c.want {
			t.Errorf("list %v: got %q, want %q", c.args, got, c.want)
		}
	}
}

func TestDLTListErrors(t *testing.T) {
	k := testenv.KafkaT(t)
	setupDLT(t, k)
	kscope(t, "dlt", "list", brokers(k)).want(t, exitUsage, "--topic", "--group")
	kscope(t, "dlt", "list", brokers(k), "--group", testGroup, "--class", "fatal").want(t, exitUsage, `unknown --class "fatal"`)
	kscope(t, "dlt", "list", brokers(k), "--group", testGroup, "--from-offset", "5", "--to-offset", "2").want(t, exitUsage, "is after --to-offset")
	kscope(t, "dlt", "list", brokers(k), "--group", testGroup, "--partition", "7").want(t, exitUsage, "has no partition 7: it has 2 partitions")
	kscope(t, "dlt", "list", brokers(k), "--group", "nobody").want(t, exitFailure, `topic "nobody.kscope-dlt" does not exist`, "check --topic or --group")
}

// The read stops at the end seen at start even when the partition ends
// with transaction markers, and aborted records are not listed.
func TestDLTListReadCommitted(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := "txn.kscope-dlt"
	createTopic(t, k, dlt, 1)
	cl, err := k.Client(kgo.TransactionalID("kscope-cli-test"), kgo.DefaultProduceTopic(dlt))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, commit := range []kgo.TransactionEndTry{kgo.TryCommit, kgo.TryAbort, kgo.TryCommit, kgo.TryAbort} {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		e := fixture[i]
		e.partition = 0
		if err := cl.ProduceSync(ctx, dltRecord(dlt, e)).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}
	got := listJSON(t, k, "--topic", dlt)
	var keys []string
	for _, e := range got {
		keys = append(keys, *e.Key)
	}
	if strings.Join(keys, ",") != "k1,k3" {
		t.Fatalf("listed keys %v, want the committed k1,k3 only", keys)
	}
	kscope(t, "dlt", "show", brokers(k), "--topic", dlt, "--partition", "0", "--offset", "2").want(t, exitFailure, "no record at offset 2")
}

func TestDLTShow(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := setupDLT(t, k)

	r := kscope(t, "dlt", "show", brokers(k), "--group", testGroup, "--partition", "1", "--offset", "0")
	r.want(t, exitOK,
		"topic:      "+dlt, "partition:  1", "offset:     0",
		"key:        k4",
		"  message-id: m-4",
		"  trace-bin: 0x00ff10 (binary)",
		"  kscope-attempt: 2",
		"  kscope-original-topic: orders",
		"value:      21 bytes, text\npayload four\nline two\n",
		"id:                 m-4",
		"attempt:            2",
		"class:              unknown",
		"error:              boom",
		"original:           orders/1/13",
		"last failure:       2024-05-01T12:30:00.000Z",
		"group:              payments",
	)

	r = kscope(t, "dlt", "show", brokers(k), "--topic", dlt, "--partition", "1", "--offset", "0", "--json")
	r.want(t, exitOK)
	var s showEntry
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, r.stdout)
	}
	if s.Value == nil || *s.Value != fixture[3].value || s.ValueSize != 21 || s.ValueTruncated || *s.Key != "k4" {
		t.Fatalf("value or key wrong: %+v", s)
	}
	if s.Metadata.ID != "m-4" || s.Metadata.Attempt != 2 || s.Metadata.OriginalOffset != 13 || s.Metadata.Class != "unknown" {
		t.Fatalf("metadata wrong: %+v", s.Metadata)
	}
	headers := map[string]headerJSON{}
	for _, h := range s.Headers {
		headers[h.Key] = h
	}
	if h := headers["trace-bin"]; h.ValueHex != "00ff10" || h.Value != nil {
		t.Fatalf("binary header as %+v", h)
	}
	if h := headers[consumer.HeaderID]; h.Value == nil || *h.Value != "m-4" {
		t.Fatalf("identity header as %+v", h)
	}

	// --max-value cuts the value.
	r = kscope(t, "dlt", "show", brokers(k), "--topic", dlt, "--partition", "1", "--offset", "0", "--max-value", "7", "--json")
	r.want(t, exitOK)
	s = showEntry{}
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatal(err)
	}
	if s.Value == nil || *s.Value != "payload" || !s.ValueTruncated || s.ValueSize != 21 {
		t.Fatalf("cut value: %+v", s)
	}
	kscope(t, "dlt", "show", brokers(k), "--topic", dlt, "--partition", "1", "--offset", "0", "--max-value", "7").
		want(t, exitOK, "first 7 shown", "\npayload\n")

	// Errors.
	kscope(t, "dlt", "show", brokers(k), "--group", testGroup, "--partition", "0", "--offset", "3").want(t, exitFailure, "not written yet: the partition ends at 3")
	kscope(t, "dlt", "show", brokers(k), "--group", testGroup, "--offset", "0").want(t, exitUsage, "--partition and --offset")
	kscope(t, "dlt", "show", brokers(k), "--group", testGroup, "--partition", "5", "--offset", "0").want(t, exitUsage, "has no partition 5")
}

func TestDLTShowBinaryValue(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := "bin.kscope-dlt"
	createTopic(t, k, dlt, 1)
	e := fixture[0]
	rec := dltRecord(dlt, e)
	rec.Key = []byte{0xff, 0xfe}
	rec.Value = []byte{0x00, 0x01, 'h', 'i', 0xff}
	produceTo(t, k, rec)
	kscope(t, "dlt", "show", brokers(k), "--topic", dlt, "--partition", "0", "--offset", "0").
		want(t, exitOK, "key:        0xfffe", "value:      5 bytes, binary", "00 01 68 69 ff")
	r := kscope(t, "dlt", "show", brokers(k), "--topic", dlt, "--partition", "0", "--offset", "0", "--json")
	r.want(t, exitOK, `"key":null`, `"key_hex":"fffe"`, `"value":null`, `"value_hex":"00016869ff"`)
	kscope(t, "dlt", "list", brokers(k), "--topic", dlt).want(t, exitOK, "0xfffe")
}

func TestDLTShowEscapesMultilineHeaders(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := setupDLT(t, k)
	kscope(t, "dlt", "show", brokers(k), "--topic", dlt, "--partition", "0", "--offset", "2").
		want(t, exitOK, `  kscope-error: timeout\ncalling the ledger service and waiting`, `error:              timeout\ncalling the ledger`,
			"  kafka_dlt-original-offset: 0x000000000000000c (binary)")
}

// An identity dead-lettered twice (a crash between the DLT's
// acknowledgement and the inbox row that remembers it) is listed once, and
// counted.
func TestDLTListGroupsAnIdentityDeadLetteredTwice(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := setupDLT(t, k)
	again := dltRecord(dlt, fixture[1]) // the same original record, dead-lettered again
	again.Partition = 1
	produceTo(t, k, again)
	r := kscope(t, "dlt", "list", brokers(k), "--group", testGroup)
	r.want(t, exitOK, "6 records in payments.kscope-dlt, 5 identities", "orders/1/11: 2 records")
	if rows := strings.Count(r.stdout, "orders/1/11"); rows != 2 { // its row and its count
		t.Fatalf("the identity dead-lettered twice is listed %d times:\n%s", rows, r.stdout)
	}
	var copies []int
	for _, e := range listJSON(t, k, "--group", testGroup) {
		if e.ID == "orders/1/11" {
			copies = append(copies, e.Copy)
		}
	}
	if fmt.Sprint(copies) != "[1 2]" {
		t.Fatalf("--json copies of the identity: %v, want [1 2]", copies)
	}
}

// A topic that is not a kscope dead-letter topic is listed, with a warning
// that says so instead of a table of "unknown" classes alone.
func TestDLTListWarnsOnOtherTopics(t *testing.T) {
	k := testenv.KafkaT(t)
	createTopic(t, k, "shipments", 1)
	produceTo(t, k, &kgo.Record{Topic: "shipments", Key: []byte("s-1"), Value: []byte("{}")})
	r := kscope(t, "dlt", "list", brokers(k), "--topic", "shipments")
	r.want(t, exitOK, "1 record in shipments")
	if !strings.Contains(r.stderr, "does not look like a kscope dead-letter topic") {
		t.Fatalf("no warning:\n%s", r.stderr)
	}
	setupDLT(t, k)
	if r := kscope(t, "dlt", "list", brokers(k), "--group", testGroup); strings.Contains(r.stderr, "does not look like") {
		t.Fatalf("a warning on a real dead-letter topic:\n%s", r.stderr)
	}
}
