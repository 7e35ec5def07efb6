package consumer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// kfakeServerSide ignores the in-process broker's goroutines of a
// connection the client closed: its reader notices a moment later, and
// its reader and writer end once the broker answered the request it still
// holds (a fetch waits up to its MaxWait). They are the broker's, not the
// runner's: a client the runner left open keeps goroutines of its own,
// which the check still finds.
var kfakeServerSide = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/twmb/franz-go/pkg/kfake.(*clientConn).read.func1"),
	goleak.IgnoreTopFunction("github.com/twmb/franz-go/pkg/kfake.(*clientConn).read"),
	goleak.IgnoreTopFunction("github.com/twmb/franz-go/pkg/kfake.(*clientConn).write"),
}

// After Run returns, every goroutine it started is gone and every finished
// record's offset is committed; Close is idempotent.
func TestShutdownCommitsAndLeavesNoGoroutines(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic = "shutdown"
	if err := k.CreateTopic(ctx, topic, 3); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, topic, 20, 10)
	testenv.SpareStarted() // its goroutines are not the runner's
	leaks := goleak.IgnoreCurrent()

	var handled atomic.Int64
	cfg := baseConfig(t, k, "g-shutdown", topic)
	cfg.CommitInterval = time.Hour // only the shutdown commit can commit
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		handled.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record handled", func() bool { return handled.Load() >= int64(total) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, append([]goleak.Option{leaks}, kfakeServerSide...)...)
	if !k.CommittedAll(t, "g-shutdown", topic) {
		t.Fatal("Run returned without committing the finished records")
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); r.Close() }()
	}
	wg.Wait()
	if err := r.Run(ctx); !errors.Is(err, consumer.ErrRunnerUsed) {
		t.Fatalf("second Run: %v, want ErrRunnerUsed", err)
	}
}

// Close stops a running runner; a handler stuck past the drain timeout gets
// its context canceled instead of holding shutdown forever.
func TestCloseCancelsStuckHandlerAfterDrainTimeout(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic = "stuck"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	k.ProduceKeyed(t, topic, 1, 3)
	testenv.SpareStarted() // its goroutines are not the runner's
	leaks := goleak.IgnoreCurrent()

	entered := make(chan struct{}, 1)
	var canceled atomic.Bool
	cfg := baseConfig(t, k, "g-stuck", topic)
	cfg.DrainTimeout = 300 * time.Millisecond
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-ctx.Done()
		canceled.Store(true)
		return ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-entered
	start := time.Now()
	r.Close()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("Close took %s with a 300ms drain timeout", el)
	}
	if !canceled.Load() {
		t.Fatal("the stuck handler's context was never canceled")
	}
	goleak.VerifyNone(t, append([]goleak.Option{leaks}, kfakeServerSide...)...)
	com, err := k.CommittedOffsets(ctx, "g-stuck", topic)
	if err != nil {
		t.Fatal(err)
	}
	if com[0] > 0 {
		t.Fatalf("committed offset %d past a record that never succeeded", com[0])
	}
}

// A handler that ignores its canceled context outlasts the drain: Run
// returns, with an error that names the record the handler holds, and the
// drain's WARN names it too.
func TestHandlerIgnoringItsContextIsNamedAtShutdown(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic = "ignores"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("fine"), Value: []byte("0")},
		&kgo.Record{Topic: topic, Key: []byte("never-returns"), Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	var logs testenv.LogBuffer
	cfg := baseConfig(t, k, "g-ignores", topic)
	cfg.DrainTimeout = 300 * time.Millisecond
	cfg.Logger = logs.Logger()
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, rec *consumer.Record) error {
		if string(rec.Key) == "never-returns" {
			close(entered)
			<-release // a call with no timeout that ignores its context
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-entered
	r.Close()
	err = <-done
	if err == nil || !strings.Contains(err.Error(), `ignores[0]@1 key "never-returns"`) {
		t.Fatalf("Run returned %v; want an error naming ignores[0]@1, the record whose handler did not return", err)
	}
	if !strings.Contains(logs.String(), `held_by_handlers="ignores[0]@1 key \"never-returns\""`) {
		t.Fatalf("the drain's WARN does not name the record:\n%s", logs.String())
	}
}

func TestCloseBeforeRun(t *testing.T) {
	r, err := consumer.New(consumer.Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}},
		consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	r.Close()
	if err := r.Run(context.Background()); !errors.Is(err, consumer.ErrRunnerUsed) {
		t.Fatalf("Run after Close: %v", err)
	}
}
