package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// fastFailures keeps in-place backoff short so that tests run quickly.
func fastFailures(p retrytopic.Policy) retrytopic.Policy {
	p.Backoff, p.MaxBackoff = time.Millisecond, 5*time.Millisecond
	return p
}

// Poison goes to the dead-letter topic at once, with its original key,
// value and headers and every failure header; a business skip is
// acknowledged and counted; a retryable failure is retried in place and
// succeeds; an unknown error gets the smaller budget, then the DLT. Per-key
// order holds across the retries.
func TestFailureRoutingByClass(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "payments", "g-fail"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	recs := []*kgo.Record{
		{Topic: topic, Key: []byte("acct-1"), Value: []byte("poison"), Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("t-1")}}},
		{Topic: topic, Key: []byte("acct-1"), Value: []byte("after-poison")},
		{Topic: topic, Key: []byte("acct-2"), Value: []byte("declined")},
		{Topic: topic, Key: []byte("acct-3"), Value: []byte("flaky")},
		{Topic: topic, Key: []byte("acct-3"), Value: []byte("after-flaky")},
		{Topic: topic, Key: []byte("acct-4"), Value: []byte("broken")},
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	var flakyCalls, brokenCalls atomic.Int64
	cfg := baseConfig(t, k, group, topic)
	cfg.Failures = fastFailures(retrytopic.Policy{SpringHeaders: true})
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		switch string(rec.Value) {
		case "poison":
			return consumer.DecodeError(errors.New("invalid JSON at byte 3"))
		case "declined":
			return consumer.Skip(errors.New("card declined"))
		case "flaky":
			if flakyCalls.Add(1) < 3 {
				return consumer.Retryable(errors.New("gateway 503"))
			}
		case "broken":
			brokenCalls.Add(1)
			return errors.New("nil pointer somewhere")
		}
		mu.Lock()
		order = append(order, string(rec.Value))
		mu.Unlock()
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == int64(len(recs)) })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	fs := r.Stats().Failures
	if fs.Skipped != 1 || fs.DeadLettered != 2 {
		t.Fatalf("failure stats %+v: want 1 skipped, 2 dead-lettered (poison, broken)", fs)
	}
	if flakyCalls.Load() != 3 || brokenCalls.Load() != int64(retrytopic.DefaultUnknownAttempts) {
		t.Fatalf("flaky handled %d times (want 3), broken %d (want %d)", flakyCalls.Load(), brokenCalls.Load(), retrytopic.DefaultUnknownAttempts)
	}
	mu.Lock()
	got := strings.Join(order, ",")
	mu.Unlock()
	for _, pair := range [][2]string{{"flaky", "after-flaky"}} {
		if strings.Index(got, pair[0]) > strings.Index(got, pair[1]) {
			t.Fatalf("order %s: %s overtook %s", got, pair[1], pair[0])
		}
	}

	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 2 {
		t.Fatalf("%d records on the DLT, want 2", len(dlt))
	}
	var poison *kgo.Record
	for _, d := range dlt {
		if string(d.Value) == "poison" {
			poison = d
		}
	}
	if poison == nil || string(poison.Key) != "acct-1" {
		t.Fatalf("the poison record is not on the DLT with its key: %v", dlt)
	}
	for h, want := range map[string]string{
		"trace":                           "t-1",
		consumer.HeaderID:                 topic + "/" + strconv.Itoa(int(recs[0].Partition)) + "/" + strconv.FormatInt(recs[0].Offset, 10),
		consumer.HeaderOriginalTopic:      topic,
		consumer.HeaderOriginalPartition:  strconv.Itoa(int(recs[0].Partition)),
		consumer.HeaderOriginalOffset:     strconv.FormatInt(recs[0].Offset, 10),
		consumer.HeaderOriginalTimestamp:  strconv.FormatInt(recs[0].Timestamp.UnixMilli(), 10),
		retrytopic.HeaderOriginalKey:      "acct-1",
		retrytopic.HeaderGroup:            group,
		retrytopic.HeaderAttempt:          "1",
		retrytopic.HeaderErrorClass:       "terminal",
		retrytopic.HeaderError:            "decode: invalid JSON at byte 3",
		retrytopic.SpringOriginalTopic:    topic,
		retrytopic.SpringOriginalGroup:    group,
		retrytopic.SpringExceptionMessage: "decode: invalid JSON at byte 3",
	} {
		if got := testenv.Header(poison, h); got != want {
			t.Errorf("DLT header %s = %q, want %q", h, got, want)
		}
	}
	for _, h := range []string{retrytopic.HeaderFirstFailure, retrytopic.HeaderLastFailure} {
		if ms, err := strconv.ParseInt(testenv.Header(poison, h), 10, 64); err != nil || time.Since(time.UnixMilli(ms)) > time.Minute {
			t.Errorf("DLT header %s = %q, want a recent time", h, testenv.Header(poison, h))
		}
	}
	checkDLTWithKcat(t, k, retrytopic.DLTopic(group), poison)
}

// checkDLTWithKcat reads the DLT with kcat (librdkafka, a non-Go client) and
// checks that it sees the same record and headers.
func checkDLTWithKcat(t *testing.T, k *testenv.Kafka, topic string, want *kgo.Record) {
	t.Helper()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat is not installed (Debian: apt-get install kcat); .ci/run installs it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kcat, "-b", strings.Join(k.Brokers, ","), "-C", "-t", topic,
		"-o", "beginning", "-e", "-J", "-q", "-X", "isolation.level=read_committed").Output()
	if err != nil {
		t.Fatalf("kcat: %v\n%s", err, out)
	}
	found := false
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m struct {
			Partition int32    `json:"partition"`
			Offset    int64    `json:"offset"`
			Key       string   `json:"key"`
			Payload   string   `json:"payload"`
			Headers   []string `json:"headers"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("kcat line %q: %v", line, err)
		}
		if m.Partition != want.Partition || m.Offset != want.Offset {
			continue
		}
		found = true
		if m.Key != string(want.Key) || m.Payload != string(want.Value) {
			t.Fatalf("kcat sees key %q value %q, want %q %q", m.Key, m.Payload, want.Key, want.Value)
		}
		hs := map[string]string{}
		for i := 0; i+1 < len(m.Headers); i += 2 {
			hs[m.Headers[i]] = m.Headers[i+1]
		}
		for _, h := range want.Headers {
			if strings.HasPrefix(h.Key, "kafka_dlt-original-") && h.Key != retrytopic.SpringOriginalTopic && h.Key != retrytopic.SpringOriginalGroup {
				continue // binary values, as Spring writes them
			}
			if hs[h.Key] != string(h.Value) {
				t.Errorf("kcat sees header %s = %q, want %q", h.Key, hs[h.Key], h.Value)
			}
		}
	}
	if !found {
		t.Fatalf("kcat did not see the DLT record at %d/%d:\n%s", want.Partition, want.Offset, out)
	}
}

// A failing produce to the dead-letter topic holds the record: its offset is
// not committed past it until the DLT acknowledges it; nothing is lost.
func TestDLTProduceFailureHoldsTheOffset(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "dltfault", "g-dltfault"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx,
		&kgo.Record{Topic: topic, Key: []byte("b"), Value: []byte("fine")},
		&kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("poison")},
		&kgo.Record{Topic: topic, Key: []byte("c"), Value: []byte("fine")}); err != nil {
		t.Fatal(err)
	}
	dlt := retrytopic.DLTopic(group)
	// The DLT rejects produce requests until the fault is removed.
	fault, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: dlt, Count: -1})
	if err != nil {
		t.Skip(err) // broker faults need the in-process kfake cluster
	}
	cfg := baseConfig(t, k, group, topic)
	cfg.Failures = fastFailures(retrytopic.Policy{})
	var fine atomic.Int64
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		if string(rec.Value) == "poison" {
			return consumer.Terminal(fmt.Errorf("bad record"))
		}
		fine.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	if err := fault.Wait(ctx, 3); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the other records handled", func() bool { return fine.Load() == 2 })
	testenv.WaitFor(t, time.Minute, "the record before it committed", func() bool {
		com, _ := k.CommittedOffsets(ctx, group, topic)
		return com[0] == 1
	})
	if err := fault.Wait(ctx, 6); err != nil { // still failing, still held
		t.Fatal(err)
	}
	if com, _ := k.CommittedOffsets(ctx, group, topic); com[0] != 1 {
		t.Fatalf("committed offset %d past the record (offset 1) whose DLT produce fails", com[0])
	}
	fault.Remove()
	testenv.WaitFor(t, time.Minute, "the poison record dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 1 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := len(k.ReadAll(t, dlt)); n != 1 {
		t.Fatalf("%d DLT records, want 1", n)
	}
	if r.Stats().Failures.DLTErrors == 0 {
		t.Fatal("no failed DLT produce was counted")
	}
}

// A dead-letter write the broker refuses is logged as an ERROR that names
// the topic and says what to change, not as a passing warning: the client
// lacks the ACL, or the record is larger than the topic's
// max.message.bytes. The record's offset is held meanwhile, and the grant,
// or the raised limit, heals it without a restart.
func TestRefusedDLTWriteIsLoggedAsAnError(t *testing.T) {
	cases := []struct {
		name string
		// refuse makes the broker refuse the dead-letter write of value
		// to dlt, and returns what heals it.
		refuse func(t *testing.T, k *testenv.Kafka, dlt string) (heal func())
		value  []byte
		words  []string // in the ERROR line, besides the topic
	}{
		{"no ACL", func(t *testing.T, k *testenv.Kafka, dlt string) func() {
			fault, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: dlt, Err: kerr.TopicAuthorizationFailed, Count: -1})
			if err != nil {
				t.Skip(err) // refusing a write needs the in-process kfake cluster
			}
			return fault.Remove
		}, []byte("poison"), []string{"grant", "TOPIC_AUTHORIZATION_FAILED"}},
		{"too large", func(t *testing.T, k *testenv.Kafka, dlt string) func() {
			limit := "2048"
			if resp, err := k.Admin().CreateTopic(context.Background(), 1, -1, map[string]*string{"max.message.bytes": &limit}, dlt); err != nil || resp.Err != nil {
				t.Fatal(err, resp.Err)
			}
			return func() {
				raised := "1048588"
				if _, err := k.Admin().AlterTopicConfigs(context.Background(), []kadm.AlterConfig{{Name: "max.message.bytes", Value: &raised}}, dlt); err != nil {
					t.Fatal(err)
				}
			}
		}, incompressible(8192), []string{"max.message.bytes", "MESSAGE_TOO_LARGE"}},
	}
	for n, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			k := testenv.KafkaT(t)
			topic, group := fmt.Sprintf("dltrefused-%d", n), fmt.Sprintf("g-dltrefused-%d", n)
			if err := k.CreateTopic(ctx, topic, 1); err != nil {
				t.Fatal(err)
			}
			dlt := retrytopic.DLTopic(group)
			heal := tc.refuse(t, k, dlt)
			if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("a"), Value: tc.value}); err != nil {
				t.Fatal(err)
			}
			var logs testenv.LogBuffer
			cfg := baseConfig(t, k, group, topic)
			cfg.Logger = logs.Logger()
			cfg.Failures = fastFailures(retrytopic.Policy{})
			r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
				return consumer.Terminal(errors.New("bad record"))
			}))
			if err != nil {
				t.Fatal(err)
			}
			stop := runAsync(t, r)
			testenv.WaitFor(t, time.Minute, "an ERROR naming the refused DLT and what to change", func() bool {
				for _, l := range strings.Split(logs.String(), "\n") {
					ok := strings.Contains(l, "level=ERROR") && strings.Contains(l, dlt)
					for _, w := range tc.words {
						ok = ok && strings.Contains(l, w)
					}
					if ok {
						return true
					}
				}
				return false
			})
			if com, _ := k.CommittedOffsets(ctx, group, topic); com[0] != 0 {
				t.Fatalf("committed offset %d past the record whose DLT write is refused", com[0])
			}
			heal()
			testenv.WaitFor(t, time.Minute, "the record dead-lettered once healed", func() bool { return r.Stats().Failures.DeadLettered == 1 })
			testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// incompressible returns n bytes the producer's compression cannot shrink:
// the broker's limit applies to a batch as compressed.
func incompressible(n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(n), byte(n >> 8)}).Read(b)
	return b
}

// The dead-letter topic must exist or be creatable; with creation turned
// off and the topic absent, Run says what to do.
func TestMissingDLTWithCreationOff(t *testing.T) {
	k := testenv.KafkaT(t)
	if err := k.CreateTopic(context.Background(), "src", 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, k, "g-nodlt", "src")
	cfg.Failures = retrytopic.Policy{DoNotCreateTopics: true}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	err = r.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "g-nodlt.kscope-dlt does not exist") || !strings.Contains(err.Error(), "create it") {
		t.Fatalf("Run: %v", err)
	}
}

// An Unordered AtLeastOnce pipeline sends a failing record through the
// delayed retry topics: it runs again no earlier than each topic's delay,
// keeps its identity and origin, and succeeds on a later hop; a record that
// keeps failing ends on the DLT with its attempts counted across hops.
func TestRetryTopicsUnordered(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "events", "g-retrytopics"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx,
		&kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("flaky")},
		&kgo.Record{Topic: topic, Key: []byte("b"), Value: []byte("hopeless")}); err != nil {
		t.Fatal(err)
	}
	ladder := []time.Duration{300 * time.Millisecond, 600 * time.Millisecond}
	cfg := baseConfig(t, k, group, topic)
	cfg.Failures = fastFailures(retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, Ladder: ladder, RetryableAttempts: 4})
	var mu sync.Mutex
	calls := map[string][]time.Time{}
	var ids []string
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		mu.Lock()
		calls[string(rec.Value)] = append(calls[string(rec.Value)], time.Now())
		n := len(calls[string(rec.Value)])
		if string(rec.Value) == "flaky" {
			ids = append(ids, cfg.Identity.Of(rec))
		}
		mu.Unlock()
		if string(rec.Value) == "flaky" && n == 3 {
			return nil
		}
		return consumer.Retryable(errors.New("dependency down"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the hopeless record dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 1 })
	testenv.WaitFor(t, time.Minute, "the flaky record to succeed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls["flaky"]) == 3
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// Attempt 1 in place; 2 after the 300ms topic; 3 after the 600ms one.
	// Due times travel in whole milliseconds.
	f := calls["flaky"]
	if gap := f[1].Sub(f[0]); gap < ladder[0]-time.Millisecond {
		t.Fatalf("second attempt %s after the first, before the 300ms retry topic's delay", gap)
	}
	if gap := f[2].Sub(f[1]); gap < ladder[1]-time.Millisecond {
		t.Fatalf("third attempt %s after the second, before the 600ms retry topic's delay", gap)
	}
	for _, id := range ids[1:] {
		if id != ids[0] {
			t.Fatalf("identity changed across hops: %v", ids)
		}
	}
	if n := len(calls["hopeless"]); n != 4 {
		t.Fatalf("the hopeless record was tried %d times, want its budget of 4 across hops", n)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || testenv.Header(dlt[0], retrytopic.HeaderAttempt) != "4" || testenv.Header(dlt[0], consumer.HeaderOriginalTopic) != topic {
		t.Fatalf("DLT %v", dlt)
	}
}

// gatewayError is an error type whose Error method reads its receiver, as
// most do.
type gatewayError struct{ status int }

func (e *gatewayError) Error() string { return "gateway answered " + strconv.Itoa(e.status) }

// A handler that returns a nil *T as its error (a non-nil error whose Error
// method panics) fails like a handler that panics: the record is retried
// and dead-lettered with an error that says what happened, and the
// process, with every other partition's work, goes on. The class the
// handler gave it is kept.
func TestErrorWhoseErrorMethodPanicsIsAFailure(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "nilerr", "g-nilerr"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx,
		&kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("unmarked")},
		&kgo.Record{Topic: topic, Key: []byte("b"), Value: []byte("terminal")},
		&kgo.Record{Topic: topic, Key: []byte("c"), Value: []byte("fine")}); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, k, group, topic)
	cfg.Failures = fastFailures(retrytopic.Policy{})
	var unmarked, fine atomic.Int64
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, rec *consumer.Record) error {
		var gerr *gatewayError // never set: a nil pointer, returned as a non-nil error
		switch string(rec.Value) {
		case "unmarked":
			unmarked.Add(1)
			return gerr
		case "terminal":
			return consumer.Terminal(gerr)
		}
		fine.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "both records dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 2 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if fine.Load() != 1 || unmarked.Load() != int64(retrytopic.DefaultUnknownAttempts) {
		t.Fatalf("the fine record handled %d times (want 1), the unmarked one %d (want its unknown budget, %d)", fine.Load(), unmarked.Load(), retrytopic.DefaultUnknownAttempts)
	}
	for _, d := range k.ReadAll(t, retrytopic.DLTopic(group)) {
		msg, class := testenv.Header(d, retrytopic.HeaderError), testenv.Header(d, retrytopic.HeaderErrorClass)
		if !strings.Contains(msg, "gatewayError") || !strings.Contains(msg, "Error method panicked") {
			t.Errorf("DLT record %s: error %q does not say the error's Error method panicked", d.Value, msg)
		}
		if want := map[string]string{"unmarked": "unknown", "terminal": "terminal"}[string(d.Value)]; class != want {
			t.Errorf("DLT record %s: class %q, want %q", d.Value, class, want)
		}
	}
}

// A record back from a retry topic waits in place as it did on its first
// hop, from Backoff up: the attempts it made on earlier hops do not stretch
// the waits that hold its key-shard, and every other key of that shard,
// while the retry topics are there to wait without holding anything.
func TestInPlaceWaitsStartOverAfterARetryTopic(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "hops", "g-hops"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("down")}); err != nil {
		t.Fatal(err)
	}
	const backoff = 400 * time.Millisecond
	cfg := baseConfig(t, k, group, topic)
	cfg.Failures = retrytopic.Policy{Unordered: true, InPlaceAttempts: 2, Ladder: []time.Duration{100 * time.Millisecond},
		RetryableAttempts: 6, Backoff: backoff, MaxBackoff: time.Minute}
	var mu sync.Mutex
	var calls []time.Time
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		mu.Lock()
		calls = append(calls, time.Now())
		mu.Unlock()
		return consumer.Retryable(errors.New("dependency down"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the record dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 6 {
		t.Fatalf("%d attempts, want 6: two in place on each of three hops", len(calls))
	}
	// The second attempt of each hop follows the first after one step,
	// drawn between backoff/2 and backoff (with room for a slow machine;
	// the attempts of the third hop used to wait 8 to 16 times longer).
	for hop := range 3 {
		if gap := calls[2*hop+1].Sub(calls[2*hop]); gap < backoff/2-time.Millisecond || gap > backoff+time.Second {
			t.Errorf("hop %d waited %s in place, want %s to %s", hop, gap, backoff/2, backoff)
		}
	}
}

// A group whose id maps to the same topic-safe name as another group's
// of the cluster ("pay/v2" and "pay_v2") would share its retry topics,
// and each group would handle the other's failed records (a second
// service acting on a payment meant for the first): Run refuses to start
// and names both groups.
func TestGroupSharingRetryTopicsIsRefused(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	for _, topic := range []string{"pay-a", "pay-b"} {
		if err := k.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
	}
	ladder := []time.Duration{100 * time.Millisecond}
	if retrytopic.RetryTopic("pay/v2", ladder[0]) != retrytopic.RetryTopic("pay_v2", ladder[0]) {
		t.Fatal("the two groups' retry topics differ; the test needs them shared")
	}
	newRunner := func(group, topic string) *consumer.Runner {
		cfg := baseConfig(t, k, group, topic)
		cfg.Failures = fastFailures(retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, Ladder: ladder})
		r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := newRunner("pay/v2", "pay-a")
	stopA := runAsync(t, a)
	testenv.WaitFor(t, time.Minute, "the first group joined", func() bool { return a.Stats().Assigned > 0 })
	ctx2, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := newRunner("pay_v2", "pay-b").Run(ctx2)
	if ctx2.Err() != nil {
		t.Fatal("the second group ran on, sharing the first group's retry topics")
	}
	if err == nil || !strings.Contains(err.Error(), `"pay/v2"`) || !strings.Contains(err.Error(), `"pay_v2"`) || !strings.Contains(err.Error(), "retry topics") {
		t.Fatalf("Run returned %v, want an error naming both groups and their shared retry topics", err)
	}
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
}
