package kscopeprom_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/kscopeprom"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/txn"
)

// An AtLeastOnce runner whose records fail in each way there is counts
// each dead letter under its reason, each in-place retry under its reason
// (a retryable failure, a handler timeout), a record its dedupe store
// remembers under source dedupe_store, its commits under their topic, and
// its deliveries under the event type their header names; promtool's lint
// passes the scrape.
func TestHandbookMetricsThroughARunner(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "prom-handbook", "g-prom-handbook"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	rec := func(key, value string, headers ...string) *kgo.Record {
		r := &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value)}
		for i := 0; i+1 < len(headers); i += 2 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
		}
		return r
	}
	routed := []string{"route", "go", "event-type", "order"}
	old := rec("x", "old", routed...)
	old.Timestamp = time.Now().Add(-2 * time.Hour)
	if err := k.Produce(ctx,
		rec("t", "terminal", routed...), rec("d", "decode", routed...), rec("s", "schema", routed...),
		rec("r", "retry", routed...), old, rec("n", "unrouted", "event-type", "order"),
		rec("w", "slow", routed...),
		rec("dup", "ok", append(routed, "message-id", "m-1")...), rec("dup", "ok", append(routed, "message-id", "m-1")...),
	); err != nil {
		t.Fatal(err)
	}
	m, err := kscopeprom.New(kscopeprom.Options{EventTypeHeader: "event-type"})
	if err != nil {
		t.Fatal(err)
	}
	var slowCalls atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
		switch string(r.Value) {
		case "terminal":
			return consumer.Terminal(errors.New("rejected"))
		case "decode":
			return consumer.DecodeError(errors.New("not json"))
		case "schema":
			return &retrytopic.DecodeFailure{Err: errors.New("no schema id 9"), Format: "avro", SchemaID: 9, HasSchemaID: true, Incompatible: true}
		case "retry":
			return consumer.Retryable(errors.New("gateway 503"))
		case "slow":
			if slowCalls.Add(1) == 1 {
				<-ctx.Done() // past HandlerTimeout: retried in place
				return ctx.Err()
			}
		}
		return nil
	})
	r, err := consumer.New(consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{topic}, CommitInterval: 50 * time.Millisecond,
		MaxAge: time.Hour, HandlerTimeout: 100 * time.Millisecond,
		Dedupe:   consumer.DedupeConfig{Store: dedupe.NewMemory(100)},
		Failures: retrytopic.Policy{InPlaceAttempts: 3, Backoff: time.Millisecond, MaxBackoff: time.Millisecond, DisableRetryTopics: true},
		Hooks:    []hook.Hook{m}, Logger: slog.New(slog.DiscardHandler),
	}, consumer.NewRouter().Header(topic, "route", "go", h))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	g := m.Gatherer()
	of := func(more ...string) map[string]string {
		l := map[string]string{"consumer_group": group, "topic": topic}
		for i := 0; i+1 < len(more); i += 2 {
			l[more[i]] = more[i+1]
		}
		return l
	}
	testenv.WaitFor(t, time.Minute, "every record done and its offset committed", func() bool {
		return r.Stats().Done == 9 && value(t, g, "kscope_offset_commits_total", of("result", "ok")) > 0 && k.CaughtUp(ctx, group, topic)
	})
	for reason, want := range map[string]float64{
		hook.ReasonTerminalFailure: 1, hook.ReasonDeserializationFailure: 1, hook.ReasonSchemaIncompatible: 1,
		hook.ReasonRetriesExhausted: 1, hook.ReasonExpired: 1, hook.ReasonNoRoute: 1,
	} {
		if v := value(t, g, "kscope_dead_letters_total", of("reason", reason)); v != want {
			t.Errorf("kscope_dead_letters_total{reason=%q} = %v, want %v", reason, v, want)
		}
	}
	if v := value(t, g, "kscope_decode_failures_total", of()); v != 2 {
		t.Errorf("kscope_decode_failures_total = %v, want 2 (the decode and the schema failure)", v)
	}
	if v := value(t, g, "kscope_handler_retries_total", of("reason", "timeout")); v != 1 {
		t.Errorf("kscope_handler_retries_total{reason=timeout} = %v, want 1", v)
	}
	if v, want := value(t, g, "kscope_handler_retries_total", of("reason", "retryable")), float64(r.Stats().Failures.Retries-1); v != want || v < 2 {
		t.Errorf("kscope_handler_retries_total{reason=retryable} = %v, want every retry but the timeout's (%v), at least 2", v, want)
	}
	if v, want := value(t, g, "kscope_handler_retries_total", of()), float64(r.Stats().Failures.Retries); v != want {
		t.Errorf("kscope_handler_retries_total summed over reason = %v, want Stats.Failures.Retries (%v)", v, want)
	}
	if v := value(t, g, "kscope_duplicates_total", of("source", hook.DuplicateDedupeStore)); v != 1 {
		t.Errorf("kscope_duplicates_total{source=dedupe_store} = %v, want 1", v)
	}
	if v := value(t, g, "kscope_records_processed_total", of("event_type", "order", "outcome", "dead_lettered")); v != 6 {
		t.Errorf("kscope_records_processed_total{event_type=order,outcome=dead_lettered} = %v, want 6", v)
	}
	if v := value(t, g, "kscope_records_processed_total", of("event_type", "order", "outcome", "duplicate")); v != 1 {
		t.Errorf("kscope_records_processed_total{event_type=order,outcome=duplicate} = %v, want 1", v)
	}
	promtoolLint(t, m)
}

// promtoolLint runs Prometheus's own lint (promtool check metrics) on what
// m's handler serves.
func promtoolLint(t *testing.T, m *kscopeprom.Metrics) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed (Debian: apt-get install prometheus); .ci/run installs it")
	}
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	scrape, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	lint := exec.Command(promtool, "check", "metrics")
	lint.Stdin = bytes.NewReader(scrape)
	if out, err := lint.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s\n%s", err, out, scrape)
	}
}

// The event_type label takes the first EventTypeLimit event types by
// name; a later one, and one that cannot be a label value, count as
// "other" and in kscope_event_type_overflow_total; a record without the
// header is "none". Without EventTypeHeader there is no event_type label.
func TestEventTypeLabelIsBounded(t *testing.T) {
	m, err := kscopeprom.New(kscopeprom.Options{EventTypeHeader: "type", EventTypeLimit: 2})
	if err != nil {
		t.Fatal(err)
	}
	end := func(typ string) {
		r := &kgo.Record{Topic: "orders"}
		if typ != "" {
			r.Headers = []kgo.RecordHeader{{Key: "type", Value: []byte(typ)}}
		}
		m.OnRecordEnd(context.Background(), hook.RecordEnd{Group: "g", Record: r, Outcome: hook.OutcomeSuccess})
	}
	for _, typ := range []string{"Placed", "Paid", "Placed", "Refunded", "Paid", "Shipped", "\xff", ""} {
		end(typ)
	}
	g := m.Gatherer()
	for typ, want := range map[string]float64{"Placed": 2, "Paid": 2, "Refunded": 0, "Shipped": 0, kscopeprom.EventTypeOther: 3, kscopeprom.EventTypeNone: 1} {
		if v := value(t, g, "kscope_records_processed_total", map[string]string{"event_type": typ}); v != want {
			t.Errorf("kscope_records_processed_total{event_type=%q} = %v, want %v", typ, v, want)
		}
	}
	if v := value(t, g, "kscope_event_type_overflow_total", map[string]string{"consumer_group": "g", "topic": "orders"}); v != 3 {
		t.Errorf("kscope_event_type_overflow_total = %v, want 3", v)
	}
	if n := series(t, g, "kscope_records_processed_total"); n != 4 {
		t.Errorf("%d series of kscope_records_processed_total, want 4 (two named, other, none)", n)
	}

	plain, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	plain.OnRecordEnd(context.Background(), hook.RecordEnd{Group: "g", Record: &kgo.Record{Topic: "orders", Headers: []kgo.RecordHeader{{Key: "type", Value: []byte("Placed")}}}, Outcome: hook.OutcomeSuccess})
	mfs, err := plain.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "event_type" {
					t.Errorf("%s has an event_type label without Options.EventTypeHeader", mf.GetName())
				}
			}
		}
	}
}

// Event-type options that cannot work fail New with a sentence that says
// what to change.
func TestEventTypeOptionsChecked(t *testing.T) {
	for _, o := range []kscopeprom.Options{{EventTypeLimit: 10}, {EventTypeHeader: "type", EventTypeLimit: -1}} {
		_, err := kscopeprom.New(o)
		if err == nil || !strings.Contains(err.Error(), "EventTypeLimit") || !strings.Contains(err.Error(), "; ") {
			t.Errorf("New(%+v) = %v, want an error naming EventTypeLimit and the fix", o, err)
		}
	}
}

// A commit request of two topics counts once under each; the dead letters
// of a scope that names no reason count by their class; duplicates count
// under the source the scope names.
func TestCommitsDeadLettersAndDuplicatesFromHooks(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := kscopeprom.New(kscopeprom.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	m.OnCommit(hook.Commit{Group: "g", Partitions: 3, Topics: []string{"a", "b"}})
	m.OnCommit(hook.Commit{Group: "g", Partitions: 1, Topics: []string{"a"}, Err: errors.New("coordinator moved")})
	for l, want := range map[[2]string]float64{{"a", "ok"}: 1, {"b", "ok"}: 1, {"a", "error"}: 1, {"b", "error"}: 0} {
		if v := value(t, reg, "kscope_offset_commits_total", map[string]string{"consumer_group": "g", "topic": l[0], "result": l[1]}); v != want {
			t.Errorf("kscope_offset_commits_total{topic=%q,result=%q} = %v, want %v", l[0], l[1], v, want)
		}
	}
	m.OnRoute(hook.Route{Group: "g", Topic: "a", Kind: "dlt", Class: "terminal"})
	m.OnRoute(hook.Route{Group: "g", Topic: "a", Kind: "dlt", Class: "retryable"})
	m.OnRoute(hook.Route{Group: "g", Topic: "a", Kind: "dlt", Class: "terminal", Reason: hook.ReasonNoRoute})
	m.OnRoute(hook.Route{Group: "g", Topic: "a", Kind: "dlt", Class: "terminal", Err: errors.New("not leader")}) // not acknowledged
	m.OnRoute(hook.Route{Group: "g", Topic: "a", Kind: "retry", Class: "retryable"})
	for reason, want := range map[string]float64{hook.ReasonTerminalFailure: 1, hook.ReasonRetriesExhausted: 1, hook.ReasonNoRoute: 1} {
		if v := value(t, reg, "kscope_dead_letters_total", map[string]string{"reason": reason}); v != want {
			t.Errorf("kscope_dead_letters_total{reason=%q} = %v, want %v", reason, v, want)
		}
	}
	if v := value(t, reg, "kscope_dead_letters_total", nil); v != 3 {
		t.Errorf("kscope_dead_letters_total = %v, want 3 (acknowledged dead letters only)", v)
	}
	for _, src := range []string{hook.DuplicateInbox, hook.DuplicateKafkaGuard, hook.DuplicateKafkaGuard} {
		m.OnRecordEvent(context.Background(), "g", &kgo.Record{Topic: "a"}, hook.EventDuplicate, src)
	}
	for src, want := range map[string]float64{hook.DuplicateInbox: 1, hook.DuplicateKafkaGuard: 2} {
		if v := value(t, reg, "kscope_duplicates_total", map[string]string{"source": src}); v != want {
			t.Errorf("kscope_duplicates_total{source=%q} = %v, want %v", src, v, want)
		}
	}
}

// The Kafka scope's guard (txn.Options.Dedupe) counts the input that
// repeats a message id under source kafka_guard, and the commits of its
// transactions under the input topic.
func TestKafkaGuardDuplicates(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const in, out, group = "prom-guard", "prom-guard.out", "g-prom-guard"
	for _, topic := range []string{in, out} {
		if err := k.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
	}
	msg := func(id string) *kgo.Record {
		return &kgo.Record{Topic: in, Key: []byte("k"), Value: []byte(id), Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}}
	}
	if err := k.Produce(ctx, msg("m1"), msg("m2"), msg("m1")); err != nil {
		t.Fatal(err)
	}
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := txn.New(consumer.Config{Brokers: k.Brokers, Group: group, Topics: []string{in}, CommitInterval: 50 * time.Millisecond,
		Hooks: []hook.Hook{m}, Logger: slog.New(slog.DiscardHandler)},
		txn.Options{TransactionalID: "prom-guard", Dedupe: &txn.DedupeOptions{}},
		txn.HandlerFunc(func(_ context.Context, r *consumer.Record, em txn.Emitter) error {
			em.Emit(&kgo.Record{Topic: out, Key: r.Key, Value: r.Value})
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	g := m.Gatherer()
	testenv.WaitFor(t, time.Minute, "the inputs committed", func() bool { return k.CaughtUp(ctx, group, in) })
	l := map[string]string{"consumer_group": group, "topic": in}
	testenv.WaitFor(t, 10*time.Second, "the duplicate's delivery counted", func() bool {
		return value(t, g, "kscope_records_processed_total", map[string]string{"consumer_group": group, "outcome": "duplicate"}) == 1
	})
	if v := value(t, g, "kscope_duplicates_total", map[string]string{"consumer_group": group, "topic": in, "source": hook.DuplicateKafkaGuard}); v != 1 {
		t.Errorf("kscope_duplicates_total{source=kafka_guard} = %v, want 1", v)
	}
	if v := value(t, g, "kscope_duplicates_total", l); v != 1 {
		t.Errorf("kscope_duplicates_total = %v, want 1", v)
	}
	if value(t, g, "kscope_offset_commits_total", map[string]string{"consumer_group": group, "topic": in, "result": "ok"}) == 0 {
		t.Error("no committed transaction counted under the input topic")
	}
}
