package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// A handler that honours its context fails at HandlerTimeout's deadline
// with an error of class retryable that matches ErrHandlerTimeout: it is
// retried in place (an unknown error would go to the DLT at once here),
// and succeeds.
func TestHandlerTimeoutRetries(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "src-timeout", "g-timeout"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	var first atomic.Value
	outs := testenv.NewOutcomes()
	cfg := baseConfig(t, k, group, topic)
	cfg.HandlerTimeout = 50 * time.Millisecond
	cfg.Failures = fastFailures(retrytopic.Policy{UnknownAttempts: 1})
	cfg.Hooks = []hook.Hook{outs}
	h := consumer.HandlerFunc(func(ctx context.Context, _ *consumer.Record) error {
		if calls.Add(1) == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	// Chain an observer in front, to see the error the runner gets.
	watch := func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
			err := next.Handle(ctx, r)
			if err != nil {
				first.CompareAndSwap(nil, err)
			}
			return err
		})
	}
	r, err := consumer.New(cfg, consumer.Chain(h, watch))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the record done", func() bool { return r.Stats().Done == 1 })
	if n := calls.Load(); n != 2 {
		t.Fatalf("handler called %d times; want 2 (timed out, then retried)", n)
	}
	if st := r.Stats(); st.Failures.Retries != 1 || st.Failures.DeadLettered != 0 {
		t.Fatalf("failure stats %+v; want one retry in place, no dead letter", st.Failures)
	}
	if got := outs.Outcome("v"); got != hook.OutcomeSuccess {
		t.Fatalf("outcome %q; want success", got)
	}
	// The middleware sees the handler's own error; the runner's deadline
	// makes it a timeout (the observer is inside the engine's call).
	if err, _ := first.Load().(error); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the handler's first error %v; want context.DeadlineExceeded", err)
	}
}

// A handler that ignores its context past HandlerTimeout and HandlerGrace
// is reported once: a WARN naming the record, Stats.HandlerOverruns, the
// event hook.EventHandlerOverrun; the stall watch reports its key-shard.
// Once it returns, the record is done.
func TestHandlerOverrunIsReported(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "src-overrun", "g-overrun"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("stuck-key"), Value: []byte("stuck")}); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var logs testenv.LogBuffer
	outs := testenv.NewOutcomes()
	stalls := &testenv.Stalls{}
	cfg := baseConfig(t, k, group, topic)
	cfg.HandlerTimeout, cfg.HandlerGrace = 50*time.Millisecond, 50*time.Millisecond
	cfg.StallWarning = 200 * time.Millisecond
	cfg.Logger = logs.Logger()
	cfg.Hooks = []hook.Hook{outs, stalls}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		<-release // ignores its context
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the overrun counted", func() bool { return r.Stats().HandlerOverruns == 1 })
	testenv.WaitFor(t, time.Minute, "the key-shard reported stalled", func() bool { return len(stalls.All()) > 0 })
	if !slices.Contains(outs.Events("stuck"), hook.EventHandlerOverrun) {
		t.Fatalf("events %v; want %s", outs.Events("stuck"), hook.EventHandlerOverrun)
	}
	var warn string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "HandlerTimeout") && strings.Contains(l, "level=WARN") {
			warn = l
		}
	}
	for _, want := range []string{"topic=" + topic, "partition=0", "offset=0", "key=stuck-key"} {
		if !strings.Contains(warn, want) {
			t.Fatalf("overrun WARN %q does not name the record (%s)", warn, want)
		}
	}
	close(release)
	testenv.WaitFor(t, time.Minute, "the record done once it returned", func() bool { return r.Stats().Done == 1 })
	if n := r.Stats().HandlerOverruns; n != 1 {
		t.Fatalf("HandlerOverruns %d; want 1 (reported once)", n)
	}
}

// Bad handler-call settings fail at construction with a sentence that says
// what to change.
func TestHandlerCallConfigErrors(t *testing.T) {
	base := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}}
	h := consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil })
	for _, tc := range []struct {
		set  func(*consumer.Config)
		want string
	}{
		{func(c *consumer.Config) { c.HandlerTimeout = -time.Second }, "Config.HandlerTimeout: is -1s"},
		{func(c *consumer.Config) { c.HandlerGrace = time.Second }, "Config.HandlerGrace: is set without HandlerTimeout"},
		{func(c *consumer.Config) { c.HandlerTimeout, c.HandlerGrace = time.Second, -time.Second }, "Config.HandlerGrace: is -1s"},
		{func(c *consumer.Config) { c.MaxAge = -time.Minute }, "Config.MaxAge: is -1m0s"},
		{func(c *consumer.Config) { c.Expired = consumer.ExpiredSkip }, "Config.Expired: is ExpiredSkip without MaxAge"},
		{func(c *consumer.Config) { c.MaxAge, c.Expired = time.Minute, 7 }, "Config.Expired: is ExpiredAction(7); use ExpiredDeadLetter or ExpiredSkip"},
	} {
		cfg := base
		tc.set(&cfg)
		_, err := consumer.New(cfg, h)
		var ce *consumer.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v; want a ConfigError containing %q", err, tc.want)
		}
	}
}
