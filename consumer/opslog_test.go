package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// A stop (Ctrl-C) says at once that it drains, and says again while a
// slow record keeps it waiting, instead of being silent until
// DrainTimeout.
func TestStopLogsTheDrain(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "drain-log", "g-drain-log"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	cfg := baseConfig(t, k, group, topic)
	cfg.Logger = logs.Logger()
	started := make(chan struct{})
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, _ *consumer.Record) error {
		close(started)
		time.Sleep(2500 * time.Millisecond) // a slow call that does not watch its context
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte("slow")}); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	for _, want := range []string{"kscope: stopping: no new records; finishing the running ones", "running=1",
		"kscope: draining: waiting for running records to finish"} {
		if !strings.Contains(out, want) {
			t.Errorf("the stop's log lacks %q:\n%s", want, out)
		}
	}
}

// 30 poison records make 10 ERROR lines and one line that counts the other
// 20, not 30 ERROR lines.
func TestDeadLetterLogIsRateLimited(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "dlt-log", "g-dlt-log"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	cfg := baseConfig(t, k, group, topic)
	cfg.Logger = logs.Logger()
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		return consumer.DecodeError(errors.New("not a payment"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	for i := range 30 {
		if err := k.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprint("poison-", i))}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, time.Minute, "30 records dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 30 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if n := strings.Count(out, `msg="kscope: record sent to the dead-letter topic"`); n != 10 {
		t.Errorf("%d ERROR lines for 30 dead letters, want 10:\n%s", n, out)
	}
	if !strings.Contains(out, "not_logged=20") {
		t.Errorf("no line counts the 20 dead letters not logged one by one:\n%s", out)
	}
}

// A handler that panics on every attempt has the panic's stack logged once
// per record, in the "stack" attribute of the first line about it; the
// lines of its later attempts, and the dead-letter record's error header,
// carry the panic's value alone.
func TestPanicStackLoggedOncePerRecord(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "panics", "g-panics"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	cfg := baseConfig(t, k, group, topic)
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	cfg.Failures = fastFailures(retrytopic.Policy{})
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, rec *consumer.Record) error {
		panic("boom " + string(rec.Value))
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("a")},
		&kgo.Record{Topic: topic, Key: []byte("b"), Value: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "both records dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	type line struct {
		Msg, Key, Err, Stack string
		Attempt              int
	}
	lines := map[string][]line{} // per key
	for _, raw := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var l line
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Fatalf("log line %q: %v", raw, err)
		}
		if l.Err != "" && l.Key != "" {
			lines[l.Key] = append(lines[l.Key], l)
		}
	}
	for _, key := range []string{"a", "b"} {
		ls := lines[key]
		if len(ls) != retrytopic.DefaultUnknownAttempts {
			t.Fatalf("record %s: %d log lines, want one per attempt (%d): %+v", key, len(ls), retrytopic.DefaultUnknownAttempts, ls)
		}
		for i, l := range ls {
			if want := "kscope: handler panicked: boom " + key; l.Err != want {
				t.Errorf("record %s, line %d (%s): err %q, want %q (the value alone)", key, i+1, l.Msg, l.Err, want)
			}
			switch {
			case i == 0 && !strings.Contains(l.Stack, "goroutine") || i == 0 && !strings.Contains(l.Stack, "panic"):
				t.Errorf("record %s: its first line (%s) has no stack: %q", key, l.Msg, l.Stack)
			case i > 0 && l.Stack != "":
				t.Errorf("record %s: line %d (%s) repeats the stack", key, i+1, l.Msg)
			}
		}
	}
	for _, d := range k.ReadAll(t, retrytopic.DLTopic(group)) {
		if msg, want := testenv.Header(d, retrytopic.HeaderError), "kscope: handler panicked: boom "+string(d.Key); msg != want {
			t.Errorf("DLT record %s: error %q, want %q", d.Key, msg, want)
		}
	}
}
