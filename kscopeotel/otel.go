// Package kscopeotel traces kscope deliveries with OpenTelemetry. Put a
// *Tracer in consumer.Config.Hooks:
//
//	cfg.Hooks = append(cfg.Hooks, kscopeotel.New(kscopeotel.Options{}))
//
// Every delivery of a record to a scope is a span ("process <topic>", kind
// consumer, as OpenTelemetry's messaging semantic conventions name it) that
// continues the producer's trace from the record's W3C
// traceparent header, so the handler's own spans (it gets the span's
// context) sit under the producer's. Dedupe hits, in-place retries, retry
// and dead-letter routing, version gaps and handler overruns (a call past
// consumer.Config.HandlerTimeout and HandlerGrace) are span events; a
// filtered or expired record ends its span with outcome filtered or
// expired, not as an error. Every record
// kscope produces for a delivery (retry and dead-letter records, Kafka-scope
// outputs) carries the span's context on, so one trace follows a record
// through its retry hops.
//
// Span attributes follow the messaging semantic conventions of semconv
// v1.43.0 (the keys come from go.opentelemetry.io/otel/semconv/v1.43.0):
// messaging.system, messaging.operation.name and .type, the destination
// (topic) and partition, messaging.kafka.offset and
// messaging.consumer.group.name; a delivery that fails (dead-lettered,
// sent to a retry topic, aborted) has error.type, the failure's class, and
// an error status. Neither the key nor the value is recorded, and error
// text is cut to MaxErrorLen. For client-level spans (produce, fetch) use
// franz-go's kotel hooks, which [Tracer.ClientOptions] returns configured
// alike; note that kotel v1.7 follows the older semconv v1.18.0 (span
// names "<topic> publish"/"<topic> receive", messaging.operation rather
// than messaging.operation.name).
package kscopeotel

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
)

// MaxErrorLen bounds the error text recorded on a span.
const MaxErrorLen = 256

// Options configure the tracer.
type Options struct {
	// TracerProvider makes the tracer. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads and writes the trace context in record headers.
	// Default: W3C trace context and baggage.
	Propagator propagation.TextMapPropagator
}

// Tracer is a kscope hook that traces deliveries.
type Tracer struct {
	tp     trace.TracerProvider
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// The hooks Tracer implements.
var (
	_ hook.RecordHook      = (*Tracer)(nil)
	_ hook.RecordEventHook = (*Tracer)(nil)
	_ hook.InjectHook      = (*Tracer)(nil)
)

// New returns a Tracer.
func New(o Options) *Tracer {
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.Propagator == nil {
		o.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return &Tracer{tp: o.TracerProvider, tracer: o.TracerProvider.Tracer("github.com/kscope-dev/kscope", trace.WithSchemaURL(semconv.SchemaURL)), prop: o.Propagator}
}

// ClientOptions returns franz-go's kotel hooks with the same provider and
// propagator, for consumer.Config.ClientOptions: client-level spans for
// produce and fetch.
func (t *Tracer) ClientOptions() []kgo.Opt {
	k := kotel.NewKotel(kotel.WithTracer(kotel.NewTracer(kotel.TracerProvider(t.tp), kotel.TracerPropagator(t.prop))))
	return []kgo.Opt{kgo.WithHooks(k.Hooks()...)}
}

// OnRecordStart implements hook.RecordHook: it starts the delivery's
// span under the trace the record carries.
func (t *Tracer) OnRecordStart(ctx context.Context, s hook.RecordStart) context.Context {
	r := s.Record
	ctx = t.prop.Extract(ctx, kotel.NewRecordCarrier(r))
	ctx, _ = t.tracer.Start(ctx, "process "+r.Topic,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemKafka,
			semconv.MessagingOperationName("process"),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(r.Topic),
			semconv.MessagingDestinationPartitionID(strconv.Itoa(int(r.Partition))),
			semconv.MessagingKafkaOffset(int(r.Offset)),
			semconv.MessagingConsumerGroupName(s.Group),
		))
	return ctx
}

// OnRecordEnd implements hook.RecordHook: it ends the span with the
// delivery's outcome.
func (t *Tracer) OnRecordEnd(ctx context.Context, e hook.RecordEnd) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.String("kscope.outcome", string(e.Outcome)))
	switch e.Outcome {
	case hook.OutcomeDeadLettered, hook.OutcomeRetried, hook.OutcomeAborted:
		msg, typ := string(e.Outcome), string(e.Outcome)
		if e.Err != nil {
			msg, typ = truncate(e.Err.Error()), consumer.ClassOf(e.Err).String()
		}
		span.SetAttributes(semconv.ErrorTypeKey.String(typ))
		span.SetStatus(codes.Error, msg)
	}
	span.End()
}

// OnRecordEvent implements hook.RecordEventHook: a span event.
func (t *Tracer) OnRecordEvent(ctx context.Context, _ string, _ *kgo.Record, ev hook.Event, detail string) {
	var opts []trace.EventOption
	if detail != "" {
		opts = append(opts, trace.WithAttributes(attribute.String("kscope.detail", truncate(detail))))
	}
	trace.SpanFromContext(ctx).AddEvent(string(ev), opts...)
}

// InjectRecord implements hook.InjectHook: the produced record carries
// the delivery's trace context.
func (t *Tracer) InjectRecord(ctx context.Context, r *kgo.Record) {
	t.prop.Inject(ctx, kotel.NewRecordCarrier(r))
}

func truncate(s string) string {
	if len(s) > MaxErrorLen {
		return s[:MaxErrorLen]
	}
	return s
}
