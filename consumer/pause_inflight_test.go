package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// logLines returns the lines of out whose message is msg.
func logLines(out, msg string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, `msg="`+msg+`"`) {
			lines = append(lines, l)
		}
	}
	return lines
}

// wantLogLine checks that out has one line of message msg, holding each
// of attrs.
func wantLogLine(t *testing.T, out, msg string, attrs ...string) {
	t.Helper()
	lines := logLines(out, msg)
	if len(lines) != 1 {
		t.Errorf("%d lines %q; want one:\n%s", len(lines), msg, out)
		return
	}
	for _, a := range attrs {
		if !strings.Contains(lines[0], a) {
			t.Errorf("the line %q lacks %s", lines[0], a)
		}
	}
}

// Records being handled when their topic is paused finish, and their
// offsets are committed while the topic stays paused; nothing produced to
// it after the pause is handled until the resume. The pause and the
// resume are logged once each (a second Pause of the same target and
// reason adds no line), with the reason.
func TestPauseLetsRunningRecordsFinishAndCommit(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group, running = "pause-running", "g-pause-running", 5
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	cfg := baseConfig(t, k, group, topic)
	cfg.Logger = logs.Logger()
	cfg.Shards = 8
	var started, after atomic.Int64
	release := make(chan struct{})
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		if strings.HasPrefix(string(rec.Value), "after-") {
			after.Add(1)
			return nil
		}
		started.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	produce := func(prefix string) {
		t.Helper()
		recs := make([]*kgo.Record, running)
		for i := range recs {
			recs[i] = &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "%s%d", prefix, i)}
		}
		if err := k.Produce(ctx, recs...); err != nil {
			t.Fatal(err)
		}
	}
	produce("running-")
	testenv.WaitFor(t, time.Minute, "the records running, each in its handler", func() bool { return started.Load() == running })
	for range 2 {
		if err := r.Pause(consumer.Topic(topic), consumer.PauseReason("maintenance")); err != nil {
			t.Fatal(err)
		}
	}
	produce("after-")
	close(release)
	committed := func() int64 {
		com, err := k.CommittedOffsets(ctx, group, topic)
		if err != nil {
			return -1
		}
		return com[0]
	}
	testenv.WaitFor(t, time.Minute, "the running records' offsets committed while paused", func() bool { return committed() == running })
	// Sample a while: nothing of the paused topic is handled, and the
	// committed offset stays.
	for range 10 {
		if n := after.Load(); n > 0 {
			t.Fatalf("%d records produced after the pause handled while paused", n)
		}
		time.Sleep(50 * time.Millisecond) // sampling, not synchronisation
	}
	if c := committed(); c != running {
		t.Fatalf("committed offset %d while paused; want %d", c, running)
	}
	if ps := r.Paused(); len(ps) != 1 {
		t.Fatalf("Paused() %+v; want the topic's pause", ps)
	}
	out := logs.String()
	wantLogLine(t, out, "kscope: paused fetching", "target="+topic, "reason=maintenance")
	if n := len(logLines(out, "kscope: resumed fetching")); n != 0 {
		t.Errorf("%d resume lines before the resume; want none", n)
	}
	if err := r.Resume(consumer.Topic(topic)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the paused topic handled after the resume", func() bool {
		return after.Load() == running && committed() == 2*running
	})
	out = logs.String()
	wantLogLine(t, out, "kscope: paused fetching", "target="+topic, "reason=maintenance")
	wantLogLine(t, out, "kscope: resumed fetching", "target="+topic, "reason=maintenance", "paused_for=")
}

// A dependency breaker's transitions are logged once each, in order:
// open (at WARN, with the error), half-open, closed; and the pause of
// fetching it makes is logged once with its reason, and its resume once.
func TestBreakerTransitionsLoggedOnce(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "brk-log", "g-brk-log"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	cfg := baseConfig(t, k, group, topic)
	cfg.Logger = logs.Logger()
	cfg.Failures.Backoff = time.Millisecond
	// The record's three attempts in place fail and open the breaker
	// (Failures 3); its fourth call, the probe, succeeds and closes it.
	cfg.Breakers = []consumer.BreakerConfig{{Name: "dep", Trips: func(err error) bool { return errors.Is(err, errDown) }, OpenFor: 200 * time.Millisecond}}
	var calls atomic.Int64
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		if calls.Add(1) <= 3 {
			return errDown
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the breaker closed and the record committed", func() bool {
		bs := r.Stats().Breakers
		return calls.Load() == 4 && len(bs) == 1 && bs[0].State == consumer.BreakerClosed && k.CaughtUp(ctx, group, topic)
	})
	out := logs.String()
	open, half, closed := "kscope: circuit breaker open: handler calls wait and fetching is paused",
		"kscope: circuit breaker half-open: one probe call goes through", "kscope: circuit breaker closed: handler calls go on"
	wantLogLine(t, out, open, "level=WARN", "breaker=dep", "state=open", "err=", "open_for=200ms")
	wantLogLine(t, out, half, "breaker=dep", "state=half-open")
	wantLogLine(t, out, closed, "breaker=dep", "state=closed")
	wantLogLine(t, out, "kscope: paused fetching", "target=all", `reason="breaker dep"`)
	wantLogLine(t, out, "kscope: resumed fetching", "target=all", `reason="breaker dep"`)
	if o, h, c := strings.Index(out, open), strings.Index(out, half), strings.Index(out, closed); !(o < h && h < c) {
		t.Errorf("the transitions logged out of order (open at %d, half-open at %d, closed at %d):\n%s", o, h, c, out)
	}
}
