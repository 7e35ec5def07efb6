package consumer_test

import (
	"context"
	"errors"
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

// tracing returns middleware that appends name's entry and exit to trace.
func tracing(name string, mu *sync.Mutex, trace *[]string) consumer.Middleware {
	add := func(s string) {
		mu.Lock()
		*trace = append(*trace, s)
		mu.Unlock()
	}
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
			add(name + ">")
			err := next.Handle(ctx, r)
			add("<" + name)
			return err
		})
	}
}

// Chain's first middleware is the outermost; a nil one is skipped.
func TestChainOrder(t *testing.T) {
	var mu sync.Mutex
	var trace []string
	h := consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		trace = append(trace, "h")
		return nil
	})
	c := consumer.Chain(h, tracing("a", &mu, &trace), nil, tracing("b", &mu, &trace))
	if err := c.Handle(context.Background(), &consumer.Record{Record: &kgo.Record{}}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(trace, " "); got != "a> b> h <b <a" {
		t.Fatalf("calls %q; want a> b> h <b <a", got)
	}
}

// In the runner, a Recover inside a logging middleware lets it see the
// handler's panic as an error; the record is routed by the failure policy
// (to the DLT here) with the panic in its error header, and the next
// record of its key is handled after it. A Timeout deadline fails a call
// with an error of class retryable that matches ErrHandlerTimeout; the
// call is retried and succeeds.
func TestMiddlewareInTheRunner(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "src-mw", "g-mw"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx,
		&kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("panics")},
		&kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("slow")},
		&kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("last")},
	); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seenErrs := map[string]error{}
	logging := func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
			err := next.Handle(ctx, r)
			mu.Lock()
			if _, ok := seenErrs[string(r.Value)]; !ok || err != nil {
				seenErrs[string(r.Value)] = err
			}
			mu.Unlock()
			return err
		})
	}
	var slowCalls atomic.Int64
	var handled seen
	h := consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
		switch string(r.Value) {
		case "panics":
			panic("boom")
		case "slow":
			if slowCalls.Add(1) == 1 {
				<-ctx.Done()
				return ctx.Err()
			}
		}
		handled.add(string(r.Value))
		return nil
	})
	cfg := baseConfig(t, k, group, topic)
	cfg.Failures = fastFailures(retrytopic.Policy{UnknownAttempts: 1})
	r, err := consumer.New(cfg, consumer.Chain(h, logging, consumer.Recover(), consumer.Timeout(50*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == 3 })
	if got := strings.Join(handled.all(), ","); got != "slow,last" {
		t.Fatalf("handled %s; want slow,last", got)
	}
	mu.Lock()
	perr, serr := seenErrs["panics"], seenErrs["slow"]
	mu.Unlock()
	if perr == nil || !strings.Contains(perr.Error(), "boom") {
		t.Fatalf("the logging middleware saw %v for the panic; want an error naming it", perr)
	}
	if !errors.Is(serr, consumer.ErrHandlerTimeout) || !errors.Is(serr, context.DeadlineExceeded) || consumer.ClassOf(serr) != consumer.ClassRetryable {
		t.Fatalf("the timed-out call failed with %v (class %s); want ErrHandlerTimeout, of class retryable", serr, consumer.ClassOf(serr))
	}
	if st := r.Stats(); st.Failures.DeadLettered != 1 || st.Failures.Retries != 1 {
		t.Fatalf("failure stats %+v; want the panic dead-lettered and the timeout retried once", st.Failures)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || !strings.Contains(testenv.Header(dlt[0], retrytopic.HeaderError), "boom") {
		t.Fatalf("DLT %v; want the panicking record with the panic in its error header", dlt)
	}
}
