package consumer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// seen records which handler got which record: "handler:topic:value".
type seen struct {
	mu  sync.Mutex
	got []string
}

func (s *seen) handler(name string) consumer.Handler {
	return consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error {
		s.add(name + ":" + r.Topic + ":" + string(r.Value))
		return nil
	})
}

func (s *seen) add(v string) {
	s.mu.Lock()
	s.got = append(s.got, v)
	s.mu.Unlock()
}

func (s *seen) has(v string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.got {
		if g == v {
			return true
		}
	}
	return false
}

func (s *seen) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

func createTopics(t *testing.T, k *testenv.Kafka, topics ...string) {
	t.Helper()
	for _, topic := range topics {
		if err := k.CreateTopic(context.Background(), topic, 2); err != nil {
			t.Fatal(err)
		}
	}
}

func produce(t *testing.T, k *testenv.Kafka, recs ...*kgo.Record) {
	t.Helper()
	if err := k.Produce(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
}

func rec(topic, value string, headers ...string) *kgo.Record {
	r := &kgo.Record{Topic: topic, Key: []byte(value), Value: []byte(value)}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
	}
	return r
}

// One runner consumes three topics; each record reaches the handler of its
// topic, of its header value, or the default.
func TestRouterRoutesByTopicHeaderAndDefault(t *testing.T) {
	k := testenv.KafkaT(t)
	createTopics(t, k, "orders", "payments", "audit")
	var s seen
	router := consumer.NewRouter().
		Topic("orders", s.handler("orders")).
		Header("payments", "event-type", "refund", s.handler("refunds")).
		Topic("payments", s.handler("payments")).
		Default(s.handler("default"))
	r, err := consumer.New(baseConfig(t, k, "g-route", "orders", "payments", "audit"), router)
	if err != nil {
		t.Fatal(err)
	}
	produce(t, k, rec("orders", "o1"), rec("payments", "p1", "event-type", "charge"),
		rec("payments", "p2", "event-type", "refund"), rec("payments", "p3"), rec("audit", "a1"))
	stop := runAsync(t, r)
	want := []string{"orders:orders:o1", "payments:payments:p1", "refunds:payments:p2", "payments:payments:p3", "default:audit:a1"}
	testenv.WaitFor(t, time.Minute, "every record handled", func() bool { return len(s.all()) >= len(want) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !s.has(w) {
			t.Errorf("missing %s; got %v", w, s.all())
		}
	}
	if got := s.all(); len(got) != len(want) {
		t.Errorf("handled %v; want each of %v once", got, want)
	}
}

// A topic of Config.Topics that the router cannot route fails New with a
// sentence naming it and what to add; so do a route for a topic the runner
// does not consume and a pattern without a route.
func TestRouterUnroutedTopicFailsConstruction(t *testing.T) {
	k := testenv.KafkaT(t)
	h := consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil })
	cfg := baseConfig(t, k, "g-unrouted", "orders", "shipments")
	_, err := consumer.New(cfg, consumer.NewRouter().Topic("orders", h).Topic("ordres", h))
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("New = %v; want a *ConfigError", err)
	}
	for _, want := range []string{
		`kscope: Config.Topics: lists "shipments", which the handler (a consumer.Router) has no route for`,
		`add a route for it (Topic("shipments", handler) or a Pattern that matches it), or a Default`,
		`kscope: consumer.Router: routes topic "ordres", which Config.Topics does not list`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New's error lacks %q:\n%v", want, err)
		}
	}
	cfg.TopicPatterns = []string{`^events\.`}
	_, err = consumer.New(cfg, consumer.NewRouter().Topic("orders", h).Topic("shipments", h))
	if err == nil || !strings.Contains(err.Error(), `Config.TopicPatterns: has "^events\\.", which the handler (a consumer.Router) has no Pattern route`) {
		t.Errorf("a pattern without a route: %v", err)
	}
	if _, err := consumer.New(cfg, consumer.NewRouter().Default(h)); err != nil {
		t.Errorf("a router with a default: %v", err)
	}
	// A middleware chain around a router keeps the check.
	cfg.TopicPatterns = nil
	_, err = consumer.New(cfg, consumer.Chain(consumer.NewRouter().Topic("orders", h), consumer.Recover()))
	if err == nil || !strings.Contains(err.Error(), `lists "shipments", which the handler (a consumer.Router) has no route for`) {
		t.Errorf("a chain around a router without a route for shipments: %v", err)
	}
}

// A record no route takes (a header value with no route, no default) goes
// to the dead-letter topic with an error naming its topic and header, and
// its offset is committed: nothing is lost, nothing blocks.
func TestRouterNoRouteGoesToTheDLT(t *testing.T) {
	k := testenv.KafkaT(t)
	createTopics(t, k, "payments")
	var s seen
	router := consumer.NewRouter().Header("payments", "event-type", "refund", s.handler("refunds"))
	r, err := consumer.New(baseConfig(t, k, "g-noroute", "payments"), router)
	if err != nil {
		t.Fatal(err)
	}
	produce(t, k, rec("payments", "p1", "event-type", "chargeback"), rec("payments", "p2", "event-type", "refund"))
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "one dead letter and the refund handled", func() bool {
		return r.Stats().Failures.DeadLettered == 1 && s.has("refunds:payments:p2")
	})
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CaughtUp(context.Background(), "g-noroute", "payments") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic("g-noroute"))
	if len(dlt) != 1 || string(dlt[0].Value) != "p1" {
		t.Fatalf("dead letters %v; want p1", dlt)
	}
	msg := testenv.Header(dlt[0], retrytopic.HeaderError)
	for _, want := range []string{`topic "payments"`, `event-type="chargeback"`, "no default"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the dead letter's error %q lacks %q", msg, want)
		}
	}
	if c := testenv.Header(dlt[0], retrytopic.HeaderErrorClass); c != retrytopic.ClassTerminal.String() {
		t.Errorf("class %q; want terminal", c)
	}
}

// A record that failed on its topic and comes back from a retry topic is
// handled by its original topic's handler again.
func TestRouterRoutesARetryByItsOriginalTopic(t *testing.T) {
	k := testenv.KafkaT(t)
	createTopics(t, k, "orders", "payments")
	var s seen
	var mu sync.Mutex
	failed := false
	orders := consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error {
		mu.Lock()
		first := !failed
		failed = true
		mu.Unlock()
		if first {
			return consumer.Retryable(errors.New("stock service down"))
		}
		s.add("orders:" + r.Topic + ":" + string(r.Value))
		return nil
	})
	cfg := baseConfig(t, k, "g-retry-route", "orders", "payments")
	cfg.Failures = retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, Backoff: time.Millisecond,
		Ladder: []time.Duration{100 * time.Millisecond}}
	r, err := consumer.New(cfg, consumer.NewRouter().Topic("orders", orders).Topic("payments", s.handler("payments")))
	if err != nil {
		t.Fatal(err)
	}
	produce(t, k, rec("orders", "o1"))
	stop := runAsync(t, r)
	retry := retrytopic.RetryTopic("g-retry-route", 100*time.Millisecond)
	testenv.WaitFor(t, time.Minute, "o1 handled from the retry topic", func() bool { return s.has("orders:" + retry + ":o1") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats().Failures; st.RetryTopic != 1 || st.DeadLettered != 0 {
		t.Errorf("failures %+v; want one record through the retry topic, none dead-lettered", st)
	}
}
