package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/retrytopic"
)

// A record's identity is read from headers any producer can set: whatever
// they hold, Of returns a bounded, valid UTF-8, non-empty identity, the same
// one every time, and the same one again after a hop through a retry or
// dead-letter topic (the dedupe key is stable across hops).
func FuzzIdentityOf(f *testing.F) {
	f.Add("", "", "", "", "", "orders", int32(3), int64(42), "")
	f.Add("pi_1", "", "", "", "", "orders", int32(0), int64(0), "")
	f.Add("", "m-7", "orders", "3", "42", "g.kscope-retry-5s", int32(0), int64(9), "x-id")
	f.Add("", "", "orders", "-1", "99999999999999999999", "t", int32(1), int64(1), "")
	f.Add(strings.Repeat("é", 300), "\xff\xfe", "\xff", "1", "1", "t", int32(0), int64(0), "message-id")
	f.Fuzz(func(t *testing.T, id, msgID, ot, op, oo, topic string, partition int32, offset int64, header string) {
		if !legalTopic(topic) {
			t.Skip("Kafka refuses this topic name")
		}
		r := &kgo.Record{Topic: topic, Partition: partition, Offset: offset}
		add := func(k, v string) {
			if v != "" {
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
			}
		}
		h := header
		if h == "" {
			h = consumer.DefaultMessageIDHeader
		}
		add(h, msgID)
		add(consumer.HeaderOriginalTopic, ot)
		add(consumer.HeaderOriginalPartition, op)
		add(consumer.HeaderOriginalOffset, oo)
		add(consumer.HeaderID, id)
		idn := consumer.Identity{Header: header}
		got := idn.Of(&consumer.Record{Record: r})
		if got == "" || !utf8.ValidString(got) {
			t.Fatalf("identity %q: empty or not UTF-8", got)
		}
		if len(got) > consumer.MaxIDLength && !strings.HasPrefix(got, "sha256:") {
			t.Fatalf("identity of %d bytes is not bounded", len(got))
		}
		if again := idn.Of(&consumer.Record{Record: r}); again != got {
			t.Fatalf("identity not stable: %q then %q", got, again)
		}
		if app := idn.Append([]byte("prefix:"), &consumer.Record{Record: r}); string(app) != "prefix:"+got {
			t.Fatalf("Append gave %q after its prefix; Of gives %q", app, got)
		}
		m, _ := retrytopic.FromRecord(r, got)
		hop := &kgo.Record{Topic: "g.kscope-dlt", Partition: 0, Offset: 1, Headers: m.Headers(r.Headers, false)}
		if after := idn.Of(&consumer.Record{Record: hop}); after != got {
			t.Fatalf("identity changed across a hop: %q became %q", got, after)
		}
	})
}

// legalTopic reports whether Kafka accepts name as a topic's: 1 to 249 of
// ASCII letters, digits, '.', '_' and '-'.
func legalTopic(name string) bool {
	if name == "" || len(name) > 249 {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Whatever values a Config holds, New never panics: it returns a
// ConfigError naming a field, or a runner whose configuration is within
// the documented bounds.
func FuzzConfig(f *testing.F) {
	f.Add("localhost:9092", "g", "t", 0, 0, int64(0), int64(0), int64(0), int64(0), 0, int64(0), int64(0), 0, 0, 0, int64(0), int64(0), "")
	f.Add("", " ", "a,a", -1, -5, int64(-1), int64(-1), int64(-1), int64(-1), 9, int64(-1), int64(-2), -1, -1, -1, int64(-1), int64(0), "bad topic!")
	f.Add("h:1,h:2", "g", "a,b", 5000, 1, int64(1), int64(90e9), int64(60e9), int64(1), 1, int64(2e9), int64(1e9), 2000, 1, 0, int64(5e9), int64(1e9), "dlt")
	f.Add("h:1", "g", "t", 4096, 10, int64(1<<20), int64(1e9), int64(2e9), int64(5e7), 0, int64(1e6), int64(1e9), 6, 3, 3, int64(1e9), int64(6e10), "g.dlt")
	nop := consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil })
	f.Fuzz(func(t *testing.T, brokers, group, topics string, shards, maxRecs int, maxBytes, drain, rebalance, commit int64,
		nullKeys int, backoff, maxBackoff int64, retryable, unknown, inPlace int, ladder1, ladder2 int64, dlt string) {
		cfg := consumer.Config{
			Group: group, Shards: shards, MaxInFlightRecords: maxRecs, MaxInFlightBytes: maxBytes,
			DrainTimeout: time.Duration(drain), RebalanceTimeout: time.Duration(rebalance), CommitInterval: time.Duration(commit),
			NullKeys: consumer.NullKeyPolicy(nullKeys),
			Failures: retrytopic.Policy{
				Backoff: time.Duration(backoff), MaxBackoff: time.Duration(maxBackoff),
				RetryableAttempts: retryable, UnknownAttempts: unknown, InPlaceAttempts: inPlace,
				DeadLetterTopic: dlt,
			},
		}
		if brokers != "" {
			cfg.Brokers = strings.Split(brokers, ",")
		}
		if topics != "" {
			cfg.Topics = strings.Split(topics, ",")
		}
		if ladder1 != 0 || ladder2 != 0 {
			cfg.Failures.Ladder = []time.Duration{time.Duration(ladder1), time.Duration(ladder2)}
		}
		r, err := consumer.New(cfg, nop)
		if err != nil {
			var ce *consumer.ConfigError
			if !errors.As(err, &ce) || ce.Field == "" || ce.Reason == "" {
				t.Fatalf("error %q is not a ConfigError naming a field", err)
			}
			return
		}
		defer r.Close()
		c := r.Config()
		if c.Shards < 1 || c.Shards > 4096 || c.MaxInFlightRecords < 1 || c.MaxInFlightBytes < 1 ||
			c.DrainTimeout <= 0 || c.DrainTimeout >= c.RebalanceTimeout || c.CommitInterval <= 0 ||
			len(c.Brokers) == 0 || len(c.Topics) == 0 || strings.TrimSpace(c.Group) == "" {
			t.Fatalf("New accepted a config outside its bounds: %+v", c)
		}
		if err := c.Failures.Validate(); err != nil {
			t.Fatalf("New accepted a failure policy that does not validate: %v", err)
		}
	})
}

// A record without identity headers is known by its coordinates. The DB
// scope computes the identity of every record it writes an inbox row for,
// so building it costs one allocation, the string's.
func TestIdentityOfCoordinates(t *testing.T) {
	r := &consumer.Record{Record: &kgo.Record{Topic: "orders", Partition: 3, Offset: 1234567890123}}
	if got := (consumer.Identity{}).Of(r); got != "orders/3/1234567890123" {
		t.Fatalf("identity %q, want orders/3/1234567890123", got)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = consumer.Identity{}.Of(r) }); n > 1 {
		t.Fatalf("%v allocations per identity, want 1", n)
	}
}

func BenchmarkIdentityOfCoordinates(b *testing.B) {
	r := &consumer.Record{Record: &kgo.Record{Topic: "orders", Partition: 3, Offset: 1234567890123}}
	b.ReportAllocs()
	for b.Loop() {
		_ = consumer.Identity{}.Of(r)
	}
}
