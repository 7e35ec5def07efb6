package retrytopic_test

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	. "github.com/kscope-dev/kscope/retrytopic"
)

func rec(headers ...string) *kgo.Record {
	r := &kgo.Record{Topic: "orders", Partition: 3, Offset: 42, Key: []byte("acct-1"), Timestamp: time.UnixMilli(1_700_000_000_000)}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
	}
	return r
}

// idOf computes the identity as the consumer package does.
func idOf(r *kgo.Record) string { return consumer.Identity{}.Of(&consumer.Record{Record: r}) }

func TestMetadataRoundTripAcrossHops(t *testing.T) {
	first, err := FromRecord(rec("message-id", "pi_1", "trace", "abc"), "pi_1")
	if err != nil {
		t.Fatal(err)
	}
	if first.ID != "pi_1" || first.OriginalTopic != "orders" || first.OriginalOffset != 42 || first.Stage != -1 {
		t.Fatalf("first hop metadata %+v", first)
	}
	now := time.UnixMilli(1_700_000_100_000)
	first.Group, first.Attempt, first.FirstFailure, first.LastFailure = "g", 2, now, now
	first.Error, first.Class, first.Due, first.Stage = "gateway 503", consumer.ClassRetryable, now.Add(5*time.Second), 0
	hop := &kgo.Record{Topic: "g.retry-5s", Partition: 0, Offset: 7, Key: []byte("acct-1"),
		Headers: first.Headers([]kgo.RecordHeader{{Key: "trace", Value: []byte("abc")}, {Key: "message-id", Value: []byte("pi_1")}}, false)}
	second, err := FromRecord(hop, idOf(hop))
	if err != nil {
		t.Fatal(err)
	}
	// The record on the retry topic keeps the identity and the origin of
	// the first one: it dedupes against it.
	if second.ID != "pi_1" || second.OriginalTopic != "orders" || second.OriginalPartition != 3 || second.OriginalOffset != 42 ||
		second.Attempt != 2 || second.Class != consumer.ClassRetryable || !second.Due.Equal(first.Due) || second.Stage != 0 ||
		!second.OriginalTimestamp.Equal(first.OriginalTimestamp) || second.Group != "g" || second.Error != "gateway 503" {
		t.Fatalf("second hop metadata %+v", second)
	}
	if v, _ := (&consumer.Record{Record: hop}).Header("trace"); string(v) != "abc" {
		t.Fatal("an original header was lost")
	}
	// Identity without a message-id: the original coordinates, stable
	// across hops.
	m, _ := FromRecord(rec(), idOf(rec()))
	hop2 := &kgo.Record{Topic: "g.retry-1m", Offset: 1, Headers: m.Headers(nil, false)}
	if id := idOf(hop2); id != "orders/3/42" {
		t.Fatalf("identity on the retry hop %q, want orders/3/42", id)
	}
}

func TestForgedAndCorruptHeaders(t *testing.T) {
	m, err := FromRecord(rec(
		HeaderAttempt, "99999999999999999999999999",
		HeaderDue, "not-a-time",
		HeaderStage, "-4",
		HeaderErrorClass, "whatever",
		HeaderOriginalTopic, "x", HeaderOriginalPartition, "nope", HeaderOriginalOffset, "1",
	), "id")
	if err == nil {
		t.Fatal("corrupt headers reported no error")
	}
	if m.Attempt != MaxAttempt {
		t.Fatalf("a forged huge attempt count read as %d, want MaxAttempt (exhausts the budget)", m.Attempt)
	}
	if !m.Due.IsZero() || m.Stage != -1 || m.OriginalTopic != "orders" {
		t.Fatalf("corrupt fields were used: %+v", m)
	}
}

func TestHeaderValuesAreBounded(t *testing.T) {
	m := Metadata{ID: "x", Error: strings.Repeat("é", 5000) + "\xff", OriginalKey: []byte(strings.Repeat("k", 5000)), Stage: -1, Attempt: 1}
	for _, h := range m.Headers(nil, true) {
		if len(h.Value) > MaxErrorLength || !utf8.Valid(h.Value) && h.Key != SpringOriginalPartition && h.Key != SpringOriginalOffset && h.Key != SpringOriginalTimestamp {
			t.Fatalf("header %s: %d bytes, valid UTF-8 %v", h.Key, len(h.Value), utf8.Valid(h.Value))
		}
	}
}

// A record on its first hop, with or without headers, reads as its own
// origin; the original key is cut to MaxKeyLength and appending to it never
// writes into the record's key.
func TestFirstHopMetadataLeavesTheRecordAlone(t *testing.T) {
	long := []byte(strings.Repeat("k", MaxKeyLength+10))
	for _, r := range []*kgo.Record{rec(), rec("traceparent", "00-abc-def-01")} {
		r.Key = append([]byte(nil), long...)
		m, err := FromRecord(r, "orders/3/42")
		if err != nil || m.Stage != -1 || m.Attempt != 0 || m.OriginalTopic != "orders" || m.OriginalPartition != 3 || m.OriginalOffset != 42 || m.ID != "orders/3/42" {
			t.Fatalf("first-hop metadata %+v (%v)", m, err)
		}
		if len(m.OriginalKey) != MaxKeyLength {
			t.Fatalf("original key of %d bytes, want %d", len(m.OriginalKey), MaxKeyLength)
		}
		_ = append(m.OriginalKey, 'x')
		if string(r.Key) != string(long) {
			t.Fatal("appending to the metadata's key changed the record's key")
		}
	}
	if m, _ := FromRecord(&kgo.Record{Topic: "t"}, "t/0/0"); m.OriginalKey != nil {
		t.Fatalf("a record without a key has original key %q, want none", m.OriginalKey)
	}
}

// Reading the metadata of a record on its first hop allocates nothing: the
// DB scope reads it for every record of every batch.
func TestFromRecordAllocatesNothing(t *testing.T) {
	for name, r := range map[string]*kgo.Record{
		"no headers":          rec(),
		"the producer's only": rec("message-id", "pi_1", "traceparent", "00-abc-def-01"),
	} {
		if n := testing.AllocsPerRun(100, func() { _, _ = FromRecord(r, "pi_1") }); n != 0 {
			t.Errorf("%s: %.0f allocations a read, want 0", name, n)
		}
	}
}

// A record whose headers are not kscope's is a first hop, however many it
// has; one kscope header among them is read.
func TestOnlyKscopeHeadersAreRead(t *testing.T) {
	m, err := FromRecord(rec("message-id", "pi_1", "attempt", "3", "kscope", "x", "Kscope-Attempt", "4"), "pi_1")
	if err != nil || m.Attempt != 0 || m.Stage != -1 {
		t.Fatalf("headers not named kscope-… read as kscope's: %+v (%v)", m, err)
	}
	m, err = FromRecord(rec("message-id", "pi_1", HeaderAttempt, "3", "traceparent", "00-abc-def-01"), "pi_1")
	if err != nil || m.Attempt != 3 {
		t.Fatalf("attempt %d (%v), want 3", m.Attempt, err)
	}
}

func FuzzFromRecord(f *testing.F) {
	f.Add("1", "1700000000000", "0", "retryable", "orders", "3", "42")
	f.Add("-1", "", "x", "", "", "", "")
	f.Add("99999999999999999999", "99999999999999999999", "65", "skip", "\xff", "-1", "9223372036854775808")
	f.Fuzz(func(t *testing.T, attempt, due, stage, class, ot, op, oo string) {
		r := rec(HeaderAttempt, attempt, HeaderDue, due, HeaderStage, stage, HeaderErrorClass, class,
			HeaderOriginalTopic, ot, HeaderOriginalPartition, op, HeaderOriginalOffset, oo)
		m, _ := FromRecord(r, idOf(r))
		if m.Attempt < 0 || m.Attempt > MaxAttempt || m.Stage < -1 || m.Stage > 64 || m.OriginalPartition < 0 || m.OriginalOffset < 0 {
			t.Fatalf("out-of-range metadata from hostile headers: %+v", m)
		}
		// What kscope writes, it reads back unchanged.
		hop := &kgo.Record{Topic: "t", Headers: m.Headers(nil, false)}
		back, err := FromRecord(hop, idOf(hop))
		if err != nil || back.Attempt != m.Attempt || back.Stage != m.Stage || back.OriginalOffset != m.OriginalOffset {
			t.Fatalf("round trip changed %+v into %+v (%v)", m, back, err)
		}
	})
}

// failedOnce is the metadata of a record on its first retry hop.
func failedOnce() (Metadata, []kgo.RecordHeader) {
	m, _ := FromRecord(rec("message-id", "pi_1", "traceparent", "00-abc-def-01"), "pi_1")
	now := time.UnixMilli(1_700_000_100_000)
	m.Group, m.Attempt, m.FirstFailure, m.LastFailure = "payments", 1, now, now
	m.Error, m.Class, m.Due, m.Stage = "gateway 503", consumer.ClassRetryable, now.Add(5*time.Second), 0
	orig := []kgo.RecordHeader{{Key: "message-id", Value: []byte("pi_1")}, {Key: "traceparent", Value: []byte("00-abc-def-01")}}
	return m, orig
}

// BenchmarkMetadataHeaders encodes a failed record's metadata into the
// headers of its retry record (once per failure).
func BenchmarkMetadataHeaders(b *testing.B) {
	m, orig := failedOnce()
	b.ReportAllocs()
	for b.Loop() {
		if hs := m.Headers(orig, false); len(hs) == 0 {
			b.Fatal("no headers")
		}
	}
}

// BenchmarkFromRecordFirstHop decodes the metadata of a record that carries
// no kscope headers yet (every record the DB scope handles, when ordered).
func BenchmarkFromRecordFirstHop(b *testing.B) {
	r := rec("message-id", "pi_1", "traceparent", "00-abc-def-01")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FromRecord(r, "pi_1"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFromRecordRetryHop decodes the metadata of a record on a retry
// topic.
func BenchmarkFromRecordRetryHop(b *testing.B) {
	m, orig := failedOnce()
	r := &kgo.Record{Topic: "payments.kscope-retry-5s", Offset: 7, Key: []byte("acct-1"), Headers: m.Headers(orig, false)}
	b.ReportAllocs()
	for b.Loop() {
		got, err := FromRecord(r, "pi_1")
		if err != nil || got.Attempt != 1 {
			b.Fatal(got, err)
		}
	}
}
