package consumer_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// topicConfig returns a topic's configuration value (its effective value,
// broker defaults included).
func topicConfig(t *testing.T, k *testenv.Kafka, topic, key string) string {
	t.Helper()
	rcs, err := k.Admin().DescribeTopicConfigs(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, rc := range rcs {
		if rc.Err != nil {
			t.Fatalf("describing %s: %v", topic, rc.Err)
		}
		for _, c := range rc.Configs {
			if c.Key == key && c.Value != nil {
				return *c.Value
			}
		}
	}
	return ""
}

// The failure topics a runner creates keep what they hold: the dead-letter
// topic never expires its records, a retry topic outlives its delay many
// times; an existing dead-letter topic that expires records is reported.
func TestFailureTopicsRetention(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "ret-src", "g-retention"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	ladder := []time.Duration{time.Second, 12 * 24 * time.Hour}
	cfg := baseConfig(t, k, group, topic)
	cfg.Failures = retrytopic.Policy{Unordered: true, Ladder: ladder}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the partition assigned", func() bool { return r.Stats().Assigned > 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if v := topicConfig(t, k, retrytopic.DLTopic(group), "retention.ms"); v != "-1" {
		t.Errorf("the DLT's retention.ms is %q, want -1 (unlimited)", v)
	}
	if v := topicConfig(t, k, retrytopic.RetryTopic(group, ladder[0]), "retention.ms"); v != "604800000" {
		t.Errorf("the 1s retry topic's retention.ms is %q, want 7 days", v)
	}
	if v := topicConfig(t, k, retrytopic.RetryTopic(group, ladder[1]), "retention.ms"); v != "4147200000" {
		t.Errorf("the 12-day retry topic's retention.ms is %q, want four times its delay", v)
	}

	// An operator's DLT that expires its records after an hour.
	const group2 = "g-retention-limited"
	one := "3600000"
	if _, err := k.Admin().CreateTopic(ctx, 1, -1, map[string]*string{"retention.ms": &one}, retrytopic.DLTopic(group2)); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	cfg = baseConfig(t, k, group2, topic)
	cfg.Logger = logs.Logger()
	r, err = consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	stop = runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the partition assigned", func() bool { return r.Stats().Assigned > 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); !strings.Contains(out, "the dead-letter topic expires its records") || !strings.Contains(out, "retention_ms=3600000") {
		t.Errorf("no warning about the DLT's limited retention in:\n%s", out)
	}
}

// A record waiting in a retry backoff does not hold a revoke or a shutdown
// for DrainTimeout: the backoff ends when its partition is revoked, and the
// record is left to the partition's next owner.
func TestRevokeEndsRetryBackoff(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "backoff-src", "g-backoff-revoke"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, k, group, topic)
	cfg.DrainTimeout = 20 * time.Second
	cfg.Failures = retrytopic.Policy{Backoff: time.Hour, MaxBackoff: time.Hour}
	var calls atomic.Int64
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		calls.Add(1)
		return consumer.Retryable(errors.New("dependency down"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the first attempt", func() bool { return calls.Load() == 1 })
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("shutdown took %s while a record slept in its backoff (DrainTimeout %s)", el, cfg.DrainTimeout)
	}
	if com, _ := k.CommittedOffsets(ctx, group, topic); com[0] > 0 {
		t.Fatalf("committed %d past the record left in its backoff", com[0])
	}
}

// Retry records waiting for their due time do not count against
// MaxInFlightRecords: a backlog of them after an outage must not stop
// source records, of any key, until the backlog comes due.
func TestWaitingRetryRecordsDoNotStarveTheSource(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const src, delay = "starve-src", "g-starve.kscope-retry-10m"
	if err := k.CreateTopic(ctx, src, 1); err != nil {
		t.Fatal(err)
	}
	// A backlog in every partition of the retry topic: more partitions
	// than the bound, each with its head not due for ten minutes.
	if err := k.CreateTopic(ctx, delay, 8); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(10 * time.Minute)
	var backlog []*kgo.Record
	for i := range 40 {
		backlog = append(backlog, &kgo.Record{Topic: delay, Partition: int32(i % 8), Key: []byte(fmt.Sprint("r", i)), Value: []byte(fmt.Sprint("retry-", i)), Headers: dueHeader(due)})
	}
	pcl, err := k.Client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	if err := pcl.ProduceSync(ctx, backlog...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	s := &delayScope{topic: delay, maxDelay: 10 * time.Minute, handled: map[string]time.Time{}}
	cfg := baseConfig(t, k, "g-starve", src)
	cfg.MaxInFlightRecords = 4
	r, err := consumer.NewScoped(cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, 20*time.Second, "every retry partition's head fetched and held", func() bool { return r.Stats().Held >= 8 })
	var fresh []*kgo.Record
	for i := range 20 {
		fresh = append(fresh, &kgo.Record{Topic: src, Key: []byte(fmt.Sprint("s", i)), Value: []byte(fmt.Sprint("source-", i))})
	}
	if err := k.Produce(ctx, fresh...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the source records handled beside the held backlog", func() bool { return s.count() == 20 })
}

// TLS configured against a broker that speaks plaintext: Run stops with an
// error that names the TLS settings, instead of waiting silently until its
// context ends.
func TestTLSAgainstPlaintextBrokerFailsRun(t *testing.T) {
	k := testenv.KafkaT(t)
	const topic = "tls-mismatch"
	if err := k.CreateTopic(context.Background(), topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, k, "g-tls-mismatch", topic)
	cfg.ClientOptions = []kgo.Opt{kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12})}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run waited until its context ended (returned %v)", err)
	}
	if !errors.Is(err, consumer.ErrBrokerSetup) || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("Run returned %v, want consumer.ErrBrokerSetup naming the TLS settings", err)
	}
}

// Brokers at an address where nothing listens, with no TLS configured:
// Run stops within its documented start bound with an error that says the
// brokers could not be reached and names the address, not one about TLS.
func TestUnreachableBrokerFailsRun(t *testing.T) {
	addr := closedPort(t)
	cfg := consumer.Config{Brokers: []string{addr}, Group: "g-unreachable", Topics: []string{"t"}, Logger: testLogger(t)}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	// The bound: the start requests' 20 s retry timeout, and a margin.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run did not return within its bound (returned %v)", err)
	}
	if !errors.Is(err, consumer.ErrBrokersUnreachable) || errors.Is(err, consumer.ErrBrokerSetup) {
		t.Fatalf("Run returned %v, want consumer.ErrBrokersUnreachable and not ErrBrokerSetup", err)
	}
	if msg := err.Error(); !strings.Contains(msg, addr) || !strings.Contains(msg, "could not be reached") || strings.Contains(msg, "TLS") {
		t.Fatalf("Run returned %q, want it to say the brokers at %s could not be reached, and no word of TLS", msg, addr)
	}
}

// closedPort returns a loopback address where nothing listens: a port the
// kernel handed out and that was closed again.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// An input topic that does not exist is reported once, by name, and
// consumed once it is created.
func TestMissingInputTopicIsReported(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic = "not-yet-created"
	var logs testenv.LogBuffer
	cfg := baseConfig(t, k, "g-missing-input", topic)
	cfg.Logger = logs.Logger()
	var handled atomic.Int64
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		handled.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, 20*time.Second, "a warning naming the missing topic", func() bool {
		return strings.Contains(logs.String(), "an input topic does not exist") && strings.Contains(logs.String(), "topic="+topic)
	})
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the record of the created topic handled", func() bool { return handled.Load() == 1 })
	if n := strings.Count(logs.String(), "an input topic does not exist"); n != 1 {
		t.Fatalf("the missing topic was reported %d times, want once", n)
	}
}

// A rung removed from the ladder, or the retry topics turned off, between
// two deployments: the records still waiting in the retry topics the
// policy no longer names are consumed (each at its due time), not
// stranded.
func TestRemovedRetryRungIsDrained(t *testing.T) {
	for _, c := range []struct {
		name  string
		after retrytopic.Policy
	}{
		{"rung removed", retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, Ladder: []time.Duration{300 * time.Millisecond}}},
		{"retry topics disabled", retrytopic.Policy{DisableRetryTopics: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			k := testenv.KafkaT(t)
			const topic, group = "rung-src", "g-rung"
			if err := k.CreateTopic(ctx, topic, 1); err != nil {
				t.Fatal(err)
			}
			if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
			// First deployment: two rungs; the record fails until it
			// waits in the second.
			ladder := []time.Duration{300 * time.Millisecond, 3 * time.Second}
			cfg := baseConfig(t, k, group, topic)
			cfg.Failures = fastFailures(retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, Ladder: ladder, RetryableAttempts: 10})
			r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
				return consumer.Retryable(errors.New("dependency down"))
			}))
			if err != nil {
				t.Fatal(err)
			}
			stop := runAsync(t, r)
			testenv.WaitFor(t, time.Minute, "the record sent to the second rung", func() bool { return r.Stats().Failures.RetryTopic == 2 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			// Second deployment without that rung: the record is handled.
			cfg.Failures = fastFailures(c.after)
			var handled atomic.Int64
			r, err = consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
				handled.Add(1)
				return nil
			}))
			if err != nil {
				t.Fatal(err)
			}
			stop = runAsync(t, r)
			testenv.WaitFor(t, 30*time.Second, "the record waiting in the removed rung handled", func() bool { return handled.Load() == 1 })
			testenv.WaitFor(t, 30*time.Second, "the removed rung's offsets committed", func() bool {
				return k.CaughtUp(ctx, group, retrytopic.RetryTopic(group, ladder[1]))
			})
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A rolling deployment that drops a retry rung (here: Unordered turned
// off) runs members of both policies side by side. A record that an old
// member sends to that rung after a new member started, while the rung
// was still empty, is handled by the new members once the old ones are
// gone: it is not stranded in a topic no member consumes.
func TestRetryRungFilledDuringRollingDeployIsDrained(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "roll-src", "g-roll"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	rung := 500 * time.Millisecond
	// The old deployment: Unordered, one rung. Its handler is still
	// running the record when the new member joins, and fails it.
	started, release := make(chan struct{}), make(chan struct{})
	cfg := baseConfig(t, k, group, topic)
	cfg.Failures = fastFailures(retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, Ladder: []time.Duration{rung}, RetryableAttempts: 5})
	var once sync.Once
	old, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		once.Do(func() { close(started) })
		<-release
		return consumer.Retryable(errors.New("gateway 503"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	stopOld := runAsync(t, old)
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("acct-1"), Value: []byte("charge")}); err != nil {
		t.Fatal(err)
	}
	<-started

	// The new deployment: ordered, no retry topics. The rung is empty
	// when it starts.
	var logs testenv.LogBuffer
	cfg.Logger = logs.Logger()
	cfg.Failures = fastFailures(retrytopic.Policy{})
	var handled atomic.Int64
	nw, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, rec *consumer.Record) error {
		if string(rec.Value) == "charge" {
			handled.Add(1)
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stopNew := runAsync(t, nw)
	testenv.WaitFor(t, 30*time.Second, "the new member started", func() bool { return strings.Contains(logs.String(), "runner started") })

	// The old member's record fails and goes to the rung; then the old
	// member leaves.
	close(release)
	testenv.WaitFor(t, 30*time.Second, "the record sent to the rung", func() bool { return old.Stats().Failures.RetryTopic == 1 })
	if err := stopOld(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the record in the rung handled by the new member", func() bool { return handled.Load() == 1 })
	testenv.WaitFor(t, 30*time.Second, "the rung's offsets committed", func() bool {
		return k.CaughtUp(ctx, group, retrytopic.RetryTopic(group, rung))
	})
	if err := stopNew(); err != nil {
		t.Fatal(err)
	}
}

// A group renamed between two deployments: the record the earlier group
// left in its retry topic is consumed by a member of that group only, so
// the renamed one never handles it. Its first start warns, naming the
// earlier group and its retry topic; a later start of the same group, and
// a group whose topics no other group consumed, do not.
func TestRenamedGroupWarnsOfEarlierRetryTopics(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, other = "renamed-src", "renamed-other"
	for _, tp := range []string{topic, other} {
		if err := k.CreateTopic(ctx, tp, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	rung := time.Hour
	cfg := baseConfig(t, k, "orders-v1", topic)
	cfg.Failures = fastFailures(retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, Ladder: []time.Duration{rung}, RetryableAttempts: 10})
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		return consumer.Retryable(errors.New("dependency down"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the record in the retry topic", func() bool { return r.Stats().Failures.RetryTopic == 1 })
	testenv.WaitFor(t, time.Minute, "the source's offset committed", func() bool { return k.CaughtUp(ctx, "orders-v1", topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	start := func(group, topic string) string {
		t.Helper()
		var logs testenv.LogBuffer
		cfg := baseConfig(t, k, group, topic)
		cfg.Failures = fastFailures(retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, Ladder: []time.Duration{rung}, RetryableAttempts: 10})
		cfg.Logger = logs.Logger()
		r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
		if err != nil {
			t.Fatal(err)
		}
		stop := runAsync(t, r)
		testenv.WaitFor(t, time.Minute, group+" caught up", func() bool { return k.CaughtUp(ctx, group, topic) })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		return logs.String()
	}
	const warning = "another group that consumed them has records waiting in its retry topics"
	logs := start("orders-v2", topic)
	if !strings.Contains(logs, warning) || !strings.Contains(logs, "earlier_group=orders-v1") ||
		!strings.Contains(logs, retrytopic.RetryTopic("orders-v1", rung)) {
		t.Fatalf("the renamed group started without a warning naming orders-v1 and its retry topic, whose record it never handles; its logs:\n%s", logs)
	}
	if logs := start("orders-v2", topic); strings.Contains(logs, warning) {
		t.Fatalf("the group's second start warned again:\n%s", logs)
	}
	if logs := start("refunds", other); strings.Contains(logs, warning) {
		t.Fatalf("a group on a topic no other group consumed warned:\n%s", logs)
	}
}
