package consumer_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Every log line about one record carries its identity as "id" (the
// kscope-id header, else the message-id header, else its coordinates), so
// that one message can be followed across services: here a retry in
// place, a dead letter and a key held by its circuit breaker.
func TestLogLinesCarryTheRecordsID(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "log-id", "g-log-id"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx,
		&kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("flaky"), Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte("pay-42")}}},
		&kgo.Record{Topic: topic, Key: []byte("b"), Value: []byte("poison"), Headers: []kgo.RecordHeader{
			{Key: consumer.DefaultMessageIDHeader, Value: []byte("not-this")}, {Key: consumer.HeaderID, Value: []byte("kid-7")}}},
		&kgo.Record{Topic: topic, Key: []byte("c"), Value: []byte("held")},
	); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	var mu sync.Mutex
	calls := map[string]int{}
	r, err := consumer.New(consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{topic}, CommitInterval: 50 * time.Millisecond,
		Failures:   retrytopic.Policy{InPlaceAttempts: 3, Backoff: time.Millisecond, MaxBackoff: time.Millisecond, DisableRetryTopics: true},
		KeyBreaker: &consumer.KeyBreakerConfig{Failures: 3, OpenFor: 100 * time.Millisecond},
		Logger:     slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error {
		mu.Lock()
		calls[string(r.Value)]++
		n := calls[string(r.Value)]
		mu.Unlock()
		switch {
		case string(r.Value) == "poison":
			return consumer.Terminal(errors.New("rejected"))
		case string(r.Value) == "flaky" && n <= 2, string(r.Value) == "held" && n <= 3:
			return consumer.Retryable(errors.New("gateway 503"))
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == 3 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	found := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		msg, _ := line["msg"].(string)
		id, hasID := line["id"].(string)
		if _, ok := line["offset"]; ok && !hasID {
			t.Errorf("a log line about one record has no id: %s", sc.Text())
		}
		for what, want := range map[string]struct{ msg, id string }{
			"retry":       {"retrying in place", "pay-42"},
			"dead letter": {"sent to the dead-letter topic", "kid-7"},
			"key held":    {"key held by its circuit breaker", fmt.Sprintf("%s/0/2", topic)},
		} {
			if strings.Contains(msg, want.msg) && id == want.id {
				found[what] = true
			}
		}
	}
	for _, what := range []string{"retry", "dead letter", "key held"} {
		if !found[what] {
			t.Errorf("no %s line carries the record's id; the log:\n%s", what, logs.String())
		}
	}
}
