package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

func header(r *kgo.Record, key string) (string, bool) {
	v, ok := (&consumer.Record{Record: r}).Header(key)
	return string(v), ok
}

// dropped are the headers a redriven record must not carry.
var dropped = []string{
	retrytopic.HeaderAttempt, retrytopic.HeaderDue, retrytopic.HeaderStage, retrytopic.HeaderParked,
	retrytopic.HeaderError, retrytopic.HeaderErrorClass, retrytopic.HeaderFirstFailure, retrytopic.HeaderLastFailure,
}

func TestRedriveToSource(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := setupDLT(t, k)

	start := time.Now().UTC().Truncate(time.Second)
	r := kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "source", "--key", "k4", "--by", "alice")
	r.want(t, exitOK, "redrive: sent 1 of 1 matching record from payments.kscope-dlt to orders (1), skipped 0", "stay in the dead-letter topic")

	got := readTopic(t, k, testSource)
	if len(got) != 1 {
		t.Fatalf("source topic holds %d records, want 1", len(got))
	}
	rec := got[0]
	if string(rec.Key) != "k4" || string(rec.Value) != fixture[3].value {
		t.Fatalf("key %q value %q, want the original ones", rec.Key, rec.Value)
	}
	// The identity travels: a consumer computes the same dedupe key as
	// for the original record, so an applied record dedupes as a no-op.
	if id := (consumer.Identity{}).Of(&consumer.Record{Record: rec}); id != "m-4" {
		t.Fatalf("redriven record's identity %q, want m-4", id)
	}
	for key, want := range map[string]string{
		consumer.HeaderID:                "m-4",
		consumer.HeaderOriginalTopic:     testSource,
		consumer.HeaderOriginalPartition: "1",
		consumer.HeaderOriginalOffset:    "13",
		retrytopic.HeaderGroup:           testGroup,
		"message-id":                     "m-4",
		"trace-bin":                      "\x00\xff\x10",
	} {
		if v, ok := header(rec, key); !ok || v != want {
			t.Errorf("header %s = %q (present %v), want %q", key, v, ok, want)
		}
	}
	for _, key := range dropped {
		if v, ok := header(rec, key); ok {
			t.Errorf("routing header %s = %q kept, want it dropped", key, v)
		}
	}
	audit, ok := header(rec, retrytopic.HeaderRedrive)
	if !ok {
		t.Fatal("no audit header")
	}
	m := regexp.MustCompile(`^by=alice at=(\S+) from=payments\.kscope-dlt/1/0$`).FindStringSubmatch(audit)
	if m == nil {
		t.Fatalf("audit header %q", audit)
	}
	at, err := time.Parse(time.RFC3339, m[1])
	if err != nil || at.Before(start) || at.After(time.Now().Add(time.Second)) || !strings.HasSuffix(m[1], "Z") {
		t.Fatalf("audit time %q (%v), want RFC 3339 UTC of now", m[1], err)
	}
	// A re-read of the redriven record shows a fresh retry budget and the
	// original metadata.
	md, err := decode(rec)
	if err != nil || md.Attempt != 0 || md.Error != "" || md.OriginalOffset != 13 || md.ID != "m-4" {
		t.Fatalf("redriven record decodes as %+v, %v", md, err)
	}

	// The DLT still holds its records.
	if n := len(listJSON(t, k, "--topic", dlt)); n != len(fixture) {
		t.Fatalf("DLT holds %d records after redrive, want %d", n, len(fixture))
	}
}

func TestRedriveAllDropsSpringHeadersAndKeepsPartitionOfNullKeys(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := setupDLT(t, k)
	// A record with a null key goes back to its original partition.
	nullKey := fixture[1]
	nullKey.origPart, nullKey.origOff = 1, 99
	rec := dltRecord(dlt, nullKey)
	rec.Key = nil
	produceTo(t, k, rec)

	kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "source", "--by", "bob", "--rate", "1000").
		want(t, exitOK, "sent 6 of 6 matching records", "to orders (6)")
	got := readTopic(t, k, testSource)
	if len(got) != 6 {
		t.Fatalf("source topic holds %d records, want 6", len(got))
	}
	for _, r := range got {
		for _, h := range r.Headers {
			if strings.HasPrefix(h.Key, "kafka_dlt-") {
				t.Errorf("record %q kept Spring header %s", r.Key, h.Key)
			}
		}
		if by, _ := header(r, retrytopic.HeaderRedrive); !strings.HasPrefix(by, "by=bob ") {
			t.Errorf("record %q audit %q", r.Key, by)
		}
		if r.Key == nil && r.Partition != 1 {
			t.Errorf("null-key record went to partition %d, want its original 1", r.Partition)
		}
	}
	// Same key, same partition.
	part := map[string]int32{}
	for _, r := range got {
		if p, ok := part[string(r.Key)]; ok && p != r.Partition && r.Key != nil {
			t.Errorf("key %q went to partitions %d and %d", r.Key, p, r.Partition)
		}
		part[string(r.Key)] = r.Partition
	}
}

func TestRedriveDryRunSendsNothing(t *testing.T) {
	k := testenv.KafkaT(t)
	setupDLT(t, k)
	r := kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "source", "--class", "terminal", "--dry-run", "--by", "carol")
	r.want(t, exitOK,
		"would send partition 0 offset 1 (key k2, id orders/1/11) to orders",
		"would send partition 1 offset 1 (key k1, id orders/0/14) to orders",
		"redrive: would send 2 of 2 matching records", "dry run: nothing was sent")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ends, err := k.EndOffsets(ctx, testSource)
	if err != nil {
		t.Fatal(err)
	}
	for p, e := range ends {
		if e != 0 {
			t.Fatalf("dry run wrote %d records to %s partition %d", e, testSource, p)
		}
	}
}

func TestRedriveToRetry(t *testing.T) {
	k := testenv.KafkaT(t)
	setupDLT(t, k)
	retry := retrytopic.RetryTopic(testGroup, retrytopic.DefaultLadder[0])
	createTopic(t, k, retry, 1)

	kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "retry", "--class", "terminal", "--by", "dave").
		want(t, exitOK, "sent 2 of 2 matching records from payments.kscope-dlt to "+retry+" (2)")
	got := readTopic(t, k, retry)
	if len(got) != 2 {
		t.Fatalf("retry topic holds %d records, want 2", len(got))
	}
	for _, r := range got {
		if id, _ := header(r, consumer.HeaderID); id != "orders/1/11" && id != "orders/0/14" {
			t.Errorf("record %q has identity %q", r.Key, id)
		}
		if _, ok := header(r, retrytopic.HeaderAttempt); ok {
			t.Errorf("record %q kept its attempt count", r.Key)
		}
		if ot, _ := header(r, consumer.HeaderOriginalTopic); ot != testSource {
			t.Errorf("record %q original topic %q", r.Key, ot)
		}
	}
	if n := len(readTopic(t, k, testSource)); n != 0 {
		t.Fatalf("source topic got %d records", n)
	}

	// Another ladder: its topic does not exist.
	kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "retry", "--ladder-first", "1m", "--by", "dave").
		want(t, exitFailure, `topic "payments.kscope-retry-1m" does not exist`, "--ladder-first", "redrive: sent 0 of 1 matching")
	// The retry topics are per group: --topic alone is not enough.
	kscope(t, "dlt", "redrive", brokers(k), "--topic", retrytopic.DLTopic(testGroup), "--to", "retry").
		want(t, exitUsage, "--to retry needs --group")
}

func TestRedriveSkipsRecordsWithoutSource(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := "foreign-dlt"
	createTopic(t, k, dlt, 1)
	createTopic(t, k, testSource, 1)
	produceTo(t, k,
		&kgo.Record{Topic: dlt, Key: []byte("x"), Value: []byte("no kscope headers")},
		dltRecord(dlt, dltEntry{key: "k9", value: "v", attempt: 1, class: retrytopic.ClassTerminal, err: "e", origOff: 3}),
	)
	r := kscope(t, "dlt", "redrive", brokers(k), "--topic", dlt, "--to", "source", "--by", "erin")
	r.want(t, exitFailure, "skipped partition 0 offset 0", "source topic is unknown", "sent 1 of 2 matching records", "skipped 1", "skipped 1 record: their source topic is unknown")
	if got := readTopic(t, k, testSource); len(got) != 1 || string(got[0].Key) != "k9" {
		t.Fatalf("source topic holds %v", got)
	}
}

func TestRedriveUsage(t *testing.T) {
	k := testenv.KafkaT(t)
	kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup).want(t, exitUsage, "--to source", "--to retry")
	kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "elsewhere").want(t, exitUsage, `unknown --to "elsewhere"`)
	kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "source", "--rate", "-1").want(t, exitUsage, "--rate")
}

func TestRedriveProgressAndRate(t *testing.T) {
	k := testenv.KafkaT(t)
	setupDLT(t, k)

	// --rate bounds the pace: 5 records at 20/s take at least 200ms.
	began := time.Now()
	kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "source", "--rate", "20", "--by", "frank").
		want(t, exitOK, "sent 5 of 5 matching records")
	if took := time.Since(began); took < 200*time.Millisecond {
		t.Fatalf("5 records at --rate 20 took %v, want at least 200ms", took)
	}

	// A progress line every 1000 records, on stderr.
	big := "big.kscope-dlt"
	createTopic(t, k, big, 1)
	var recs []*kgo.Record
	for i := range 1001 {
		e := fixture[0]
		e.key, e.origOff = fmt.Sprintf("key-%d", i), int64(i)
		recs = append(recs, dltRecord(big, e))
	}
	produceTo(t, k, recs...)
	r := kscope(t, "dlt", "redrive", brokers(k), "--topic", big, "--to", "source", "--dry-run", "--by", "frank")
	r.want(t, exitOK, "redrive: would send 1001 of 1001 matching records")
	if !strings.Contains(r.stderr, "redrive: would send 1000 records, skipped 0; scanned 1000 of 1001 records (100%), at partition 0 offset 999") ||
		!strings.Contains(r.stderr, "ETA ") {
		t.Fatalf("no progress line on stderr:\n%s", r.stderr)
	}
	if strings.Count(r.stdout, "would send partition") != 1001 {
		t.Fatalf("dry run did not print every record")
	}
	kscope(t, "dlt", "list", brokers(k), "--topic", big).want(t, exitOK, "key-1000", "1001 records in big.kscope-dlt")
}

func TestRedriveStopsAtFirstProduceError(t *testing.T) {
	k := testenv.KafkaT(t)
	setupDLT(t, k)
	h, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: testSource, Err: kerr.TopicAuthorizationFailed, Count: -1})
	if err != nil {
		t.Skip(err)
	}
	defer h.Remove()
	r := kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "source", "--rate", "0", "--by", "gina")
	r.want(t, exitFailure, "producing partition 0 offset 0 to orders failed after 0 records sent",
		"TOPIC_AUTHORIZATION_FAILED", "resume from this record with --partition 0 --from-offset 0", "redrive: sent 0 of 1 matching record")
}

// --json: the summary (and, with --dry-run, each record) as JSON objects
// a script can read. A dry run sends nothing: it says so ("sent":0) and
// counts what it would send apart, as its text does ("would send").
func TestRedriveJSON(t *testing.T) {
	k := testenv.KafkaT(t)
	setupDLT(t, k)
	r := kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "source", "--dry-run", "--json", "--by", "frank")
	r.want(t, exitOK)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 6 {
		t.Fatalf("%d lines, want 5 records and the summary:\n%s", len(lines), r.stdout)
	}
	var rec struct {
		Partition *int32 `json:"partition"`
		Offset    *int64 `json:"offset"`
		Target    string `json:"target"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil || rec.Partition == nil || rec.Offset == nil || rec.Target == "" {
		t.Fatalf("record line %q: %v", lines[0], err)
	}
	var sum struct {
		DryRun    bool           `json:"dry_run"`
		Matched   int            `json:"matched"`
		Sent      *int           `json:"sent"`
		WouldSend *int           `json:"would_send"`
		Scanned   int            `json:"scanned"`
		PerTopic  map[string]int `json:"per_topic"`
	}
	if err := json.Unmarshal([]byte(lines[5]), &sum); err != nil || !sum.DryRun || sum.Matched != 5 || sum.Sent == nil || *sum.Sent != 0 ||
		sum.WouldSend == nil || *sum.WouldSend != 5 || sum.Scanned != 5 || sum.PerTopic[testSource] != 5 {
		t.Fatalf("dry-run summary %q (%v): want sent 0, would_send 5 to orders", lines[5], err)
	}
	if got := readTopic(t, k, testSource); len(got) != 0 {
		t.Fatalf("the dry run sent %d records", len(got))
	}
	r = kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "source", "--json", "--by", "frank")
	r.want(t, exitOK, `"dry_run":false`, `"sent":5`)
	if strings.Contains(r.stdout, "would_send") {
		t.Fatalf("a redrive that sends reports would_send: %s", r.stdout)
	}
}

// Retention deletes records of a partition that the redrive, which reads
// the partitions one after the other, has not reached yet: the redrive
// does not report them sent or pass over them in silence; it stops, names
// the records it could not read and where to resume.
func TestRedriveSaysWhatRetentionDeletedBeforeItsRead(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := "retention.kscope-dlt"
	createTopic(t, k, testSource, 2)
	createTopic(t, k, dlt, 2)
	var recs []*kgo.Record
	for i := range 10 {
		e := fixture[0]
		e.partition, e.key, e.origOff = 0, fmt.Sprintf("p0-%d", i), int64(i)
		recs = append(recs, dltRecord(dlt, e))
	}
	for i := range 3 {
		e := fixture[0]
		e.partition, e.key, e.origOff = 1, fmt.Sprintf("p1-%d", i), int64(100+i)
		recs = append(recs, dltRecord(dlt, e))
	}
	produceTo(t, k, recs...)

	done := make(chan result, 1)
	go func() { // partition 0 takes about a second at --rate 10
		done <- kscope(t, "dlt", "redrive", brokers(k), "--topic", dlt, "--to", "source", "--rate", "10", "--by", "hana")
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitFor(t, "the first record redriven", func() (bool, error) {
		e, err := k.EndOffsets(ctx, testSource)
		return err == nil && e[0]+e[1] > 0, err
	})
	del := kadm.Offsets{}
	del.Add(kadm.Offset{Topic: dlt, Partition: 1, At: 2}) // retention drops offsets 0 and 1
	if resp, err := k.Admin().DeleteRecords(ctx, del); err != nil || resp.Error() != nil {
		t.Fatalf("deleting records: %v, %v", err, resp.Error())
	}
	r := <-done
	r.want(t, exitFailure, "redrive: sent 10 of 10 matching records",
		"records of retention.kscope-dlt partition 1 from offset 0 to 1 were deleted (retention) before they were read",
		"resume with --partition 1 --from-offset 2")
	if n := len(readTopic(t, k, testSource)); n != 10 {
		t.Fatalf("%d records redriven, want the 10 of partition 0", n)
	}
}

// A transaction still open in the dead-letter topic holds back, for a
// read-committed reader, the records committed after it began: the
// redrive names them as not read, and so does the list, instead of
// reporting the topic done.
func TestRedriveSaysWhatAnOpenTransactionHoldsBack(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := "open.kscope-dlt"
	createTopic(t, k, testSource, 2)
	createTopic(t, k, dlt, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inTxn := func(txnID, key string, commit bool) {
		cl, err := k.Client(kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(dlt), kgo.TransactionTimeout(5*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		e := fixture[0]
		e.partition, e.key = 0, key
		if err := cl.ProduceSync(ctx, dltRecord(dlt, e)).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
		}
	}
	inTxn("dlt-writer-a", "before", true)
	inTxn("dlt-writer-b", "open", false) // its producer died mid-transaction
	inTxn("dlt-writer-c", "after", true)
	// Offsets: 0 before, 1 its commit marker, 2 open, 3 after, 4 its marker.

	kscope(t, "dlt", "redrive", brokers(k), "--topic", dlt, "--to", "source", "--by", "ivan").want(t, exitFailure,
		"redrive: sent 1 of 1 matching record",
		"partition 0: a transaction open since offset 2 holds back offsets 2 to 4, not read",
		"--partition 0 --from-offset 2")
	kscope(t, "dlt", "list", brokers(k), "--topic", dlt).want(t, exitOK,
		"1 record in open.kscope-dlt",
		"warning: partition 0: a transaction open since offset 2 holds back offsets 2 to 4, not read")
	kscope(t, "dlt", "show", brokers(k), "--topic", dlt, "--partition", "0", "--offset", "3").want(t, exitFailure,
		"offset 3 of open.kscope-dlt partition 0 is held back by a transaction open since offset 2")
}

// A consumer killed between the DLT's acknowledgement and the transaction
// that records it dead-letters the record again: the DLT holds two copies
// of one identity. A redrive sends the record once, so that a consumer
// without an inbox (the at-least-once scope: an e-mail, a webhook) does
// not handle it twice for one redrive.
func TestRedriveSendsAnIdentityDeadLetteredTwiceOnce(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := setupDLT(t, k)
	again := dltRecord(dlt, fixture[1]) // orders/1/11, dead-lettered again
	again.Partition = 1
	produceTo(t, k, again)

	kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "source", "--dry-run", "--by", "jo").
		want(t, exitOK, "redrive: would send 5 of 6 matching records", "1 later copy of an identity sent once")
	r := kscope(t, "dlt", "redrive", brokers(k), "--group", testGroup, "--to", "source", "--by", "jo")
	r.want(t, exitOK, "redrive: sent 5 of 6 matching records", "1 later copy of an identity sent once")
	n := 0
	for _, rec := range readTopic(t, k, testSource) {
		if id, _ := header(rec, consumer.HeaderID); id == "orders/1/11" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the identity dead-lettered twice was redriven %d times, want once", n)
	}
}
