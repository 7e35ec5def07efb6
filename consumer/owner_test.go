package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Config.Owner is the kscope-owner header of every record the runner
// routes: the dead letters (a poison record at once, a retryable one once
// its retry topics are spent) and the records in its retry topics. An
// owner header the record carried from elsewhere is replaced.
func TestOwnerIsOnEveryRoutedRecord(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group, owner = "owned", "g-owned", "payments <#payments-oncall>"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	forged := []kgo.RecordHeader{{Key: retrytopic.HeaderOwner, Value: []byte("someone else")}}
	if err := k.Produce(ctx,
		&kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("poison"), Headers: forged},
		&kgo.Record{Topic: topic, Key: []byte("b"), Value: []byte("flaky")},
	); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, k, group, topic)
	cfg.Owner = owner
	cfg.Failures = fastFailures(retrytopic.Policy{Ladder: []time.Duration{50 * time.Millisecond}, InPlaceAttempts: 1, RetryableAttempts: 2, Unordered: true})
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		if string(rec.Value) == "poison" {
			return consumer.DecodeError(errors.New("not JSON"))
		}
		return consumer.Retryable(errors.New("gateway 503"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "both records dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	retried := k.ReadAll(t, retrytopic.RetryTopic(group, 50*time.Millisecond))
	if len(dlt) != 2 || len(retried) != 1 {
		t.Fatalf("%d dead letters and %d retry-topic records, want 2 and 1", len(dlt), len(retried))
	}
	for _, rec := range append(dlt, retried...) {
		if got := testenv.Header(rec, retrytopic.HeaderOwner); got != owner {
			t.Errorf("%s record %q carries owner %q, want %q", rec.Topic, rec.Value, got, owner)
		}
		m, err := retrytopic.FromRecord(rec, "")
		if err != nil || m.Owner != owner {
			t.Errorf("FromRecord: owner %q, err %v", m.Owner, err)
		}
	}
}

// An owner that is not one line of text is refused at construction.
func TestOwnerMustBeOneLine(t *testing.T) {
	for _, owner := range []string{"payments\n<#oncall>", strings.Repeat("x", retrytopic.MaxOwnerLength+1)} {
		_, err := consumer.New(consumer.Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, Owner: owner},
			consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
		var ce *consumer.ConfigError
		if !errors.As(err, &ce) || ce.Field != "Owner" {
			t.Fatalf("owner %.20q: got %v, want a ConfigError on Owner", owner, err)
		}
	}
}
