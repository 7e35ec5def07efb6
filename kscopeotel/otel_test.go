package kscopeotel_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/internal/testmain"
	"github.com/kscope-dev/kscope/kscopeotel"
	"github.com/kscope-dev/kscope/retrytopic"
)

func TestMain(m *testing.M) { testmain.Main(m) }

// A record produced under a trace is handled in a span whose parent is the
// producer's; failing twice, it hops through the retry topic, and each
// hop's span continues the same trace under the previous one.
func TestDeliverySpansFollowTheRecordThroughItsRetries(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	if err := k.CreateTopic(ctx, "orders", 1); err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(ctx) //nolint:errcheck // in-memory
	prop := propagation.TraceContext{}

	// The producer's span, carried in the record's traceparent header.
	pctx, producer := tp.Tracer("producer").Start(ctx, "orders publish")
	r := &kgo.Record{Topic: "orders", Key: []byte("secret-customer-key"), Value: []byte("secret-card-number")}
	prop.Inject(pctx, kotel.NewRecordCarrier(r))
	producer.End()
	if err := k.Produce(ctx, r); err != nil {
		t.Fatal(err)
	}

	var calls, done atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
		_, span := tp.Tracer("handler").Start(ctx, "charge")
		defer span.End()
		if calls.Add(1) <= 2 {
			return consumer.Retryable(errors.New("gateway 503"))
		}
		done.Add(1)
		return nil
	})
	run, err := consumer.New(consumer.Config{
		Brokers: k.Brokers, Group: "traced", Topics: []string{"orders"}, Shards: 2,
		Logger: slog.New(slog.DiscardHandler),
		Hooks:  []hook.Hook{kscopeotel.New(kscopeotel.Options{TracerProvider: tp, Propagator: prop})},
		Failures: retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, RetryableAttempts: 5,
			Backoff: time.Millisecond, MaxBackoff: time.Millisecond, Ladder: []time.Duration{50 * time.Millisecond}},
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- run.Run(rctx) }()
	testenv.WaitFor(t, 20*time.Second, "the record handled after two retries", func() bool { return done.Load() == 1 })
	testenv.WaitFor(t, 10*time.Second, "three delivery spans ended", func() bool {
		n := 0
		for _, s := range rec.Ended() {
			if strings.HasPrefix(s.Name(), "process ") {
				n++
			}
		}
		return n == 3
	})
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

	var deliveries, handlers []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch {
		case strings.HasPrefix(s.Name(), "process "):
			deliveries = append(deliveries, s)
		case s.Name() == "charge":
			handlers = append(handlers, s)
		}
	}
	trace := producer.SpanContext().TraceID()
	parent := producer.SpanContext().SpanID()
	for i, s := range deliveries {
		if s.SpanContext().TraceID() != trace {
			t.Fatalf("delivery %d is in trace %s, want the producer's %s", i, s.SpanContext().TraceID(), trace)
		}
		if s.Parent().SpanID() != parent {
			t.Fatalf("delivery %d's parent is %s, want %s (the producer's span, then the previous hop's)", i, s.Parent().SpanID(), parent)
		}
		parent = s.SpanContext().SpanID()
		outcome := ""
		attrs := map[string]string{}
		for _, a := range s.Attributes() {
			attrs[string(a.Key)] = a.Value.String()
			if a.Key == "kscope.outcome" {
				outcome = a.Value.AsString()
			}
			if strings.Contains(a.Value.String(), "secret") {
				t.Errorf("span attribute %s carries the record's key or value", a.Key)
			}
		}
		want, event := "retried", "kscope.retry_topic"
		if i == 2 {
			want, event = "success", ""
		}
		// The messaging semantic conventions: the span's name and keys.
		topic := "orders"
		if i > 0 {
			topic = "traced.kscope-retry-50ms" // the later hops come from the retry topic
		}
		if s.Name() != "process "+topic || attrs["messaging.operation.name"] != "process" || attrs["messaging.system"] != "kafka" ||
			attrs["messaging.destination.name"] != topic || attrs["messaging.consumer.group.name"] != "traced" {
			t.Errorf("delivery %d: name %q, attributes %v", i, s.Name(), attrs)
		}
		if wantType := map[bool]string{true: "retryable", false: ""}[want == "retried"]; attrs["error.type"] != wantType {
			t.Errorf("delivery %d: error.type %q, want %q", i, attrs["error.type"], wantType)
		}
		if outcome != want {
			t.Errorf("delivery %d ended %q, want %q", i, outcome, want)
		}
		if event != "" && (len(s.Events()) == 0 || s.Events()[len(s.Events())-1].Name != event) {
			t.Errorf("delivery %d has events %v, want %s last", i, s.Events(), event)
		}
	}
	if len(handlers) != 3 {
		t.Fatalf("%d handler spans, want 3", len(handlers))
	}
	for i, hs := range handlers {
		if hs.Parent().SpanID() != deliveries[i].SpanContext().SpanID() {
			t.Errorf("handler span %d is not a child of its delivery's span", i)
		}
	}
}
