package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// A runner with a topic pattern consumes a topic created after it started;
// that topic's failing record goes through the group's retry topic to its
// dead-letter topic, back to the pattern's handler in between; and the
// retry and dead-letter topics of kscope (this group's and another's), all
// of which the pattern matches, are never consumed as source topics.
func TestTopicPatternsConsumeNewTopicsWithRetriesAndDLT(t *testing.T) {
	k := testenv.KafkaT(t)
	const group = "events.g" // its retry and dead-letter topics match the pattern too
	createTopics(t, k, "events.a", "events.other.kscope-dlt", "events.x.kscope-retry-5s")
	produce(t, k, rec("events.a", "a1"), rec("events.other.kscope-dlt", "foreign-dead-letter"), rec("events.x.kscope-retry-5s", "foreign-retry"))
	var s seen
	h := consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error {
		s.add(r.Topic + ":" + string(r.Value))
		if string(r.Value) == "bad" {
			return consumer.Retryable(errors.New("cannot handle bad"))
		}
		return nil
	})
	cfg := baseConfig(t, k, group)
	cfg.TopicPatterns = []string{`^events\.`}
	cfg.ClientOptions = []kgo.Opt{kgo.MetadataMinAge(50 * time.Millisecond), kgo.MetadataMaxAge(200 * time.Millisecond)}
	cfg.Failures = retrytopic.Policy{Unordered: true, InPlaceAttempts: 1, RetryableAttempts: 2, Backoff: time.Millisecond,
		Ladder: []time.Duration{100 * time.Millisecond}}
	r, err := consumer.New(cfg, consumer.NewRouter().Pattern(`^events\.`, h))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the existing topic consumed", func() bool { return s.has("events.a:a1") })

	createTopics(t, k, "events.new")
	produce(t, k, rec("events.new", "n1"), rec("events.new", "bad"))
	retry := retrytopic.RetryTopic(group, 100*time.Millisecond)
	// A record from one of kscope's topics ends the wait too: the checks
	// below name it.
	fromKscope := func() bool {
		return slices.ContainsFunc(s.all(), func(g string) bool {
			return strings.Contains(g, "foreign") || strings.HasPrefix(g, retrytopic.DLTopic(group))
		})
	}
	testenv.WaitFor(t, time.Minute, "the new topic's records handled, the bad one dead-lettered", func() bool {
		return s.has("events.new:n1") && s.has(retry+":bad") && r.Stats().Failures.DeadLettered == 1 || fromKscope()
	})
	consumed := r.Client().GetConsumeTopics()
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CaughtUp(context.Background(), group, "events.new") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"events.a", "events.new", retry} {
		if !slices.Contains(consumed, want) {
			t.Errorf("consumed topics %v lack %s", consumed, want)
		}
	}
	for _, topic := range []string{retrytopic.DLTopic(group), "events.other.kscope-dlt", "events.x.kscope-retry-5s"} {
		if slices.Contains(consumed, topic) {
			t.Errorf("kscope's topic %s is consumed as a source topic: %v", topic, consumed)
		}
	}
	if fromKscope() {
		t.Fatalf("the handler got records from kscope's topics: %v", s.all())
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || string(dlt[0].Value) != "bad" || testenv.Header(dlt[0], retrytopic.HeaderOriginalTopic) != "events.new" {
		t.Fatalf("dead letters %v; want bad, from events.new", dlt)
	}
}

// A pattern that is not a regular expression, or is empty, fails New; so
// does a pattern in the Kafka scope's runner, which consumes named topics
// only (txn's tests check that).
func TestTopicPatternsValidation(t *testing.T) {
	k := testenv.KafkaT(t)
	h := consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil })
	cfg := baseConfig(t, k, "g-bad-pattern")
	cfg.TopicPatterns = []string{`^events\.(`, ""}
	_, err := consumer.New(cfg, h)
	for _, want := range []string{`kscope: Config.TopicPatterns: "^events\\.(" is not a regular expression`, "holds an empty pattern"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New = %v; want an error containing %q", err, want)
		}
	}
	cfg.TopicPatterns = nil
	if _, err := consumer.New(cfg, h); err == nil || !strings.Contains(err.Error(), "Config.Topics: no topic given") {
		t.Errorf("no topics nor patterns: %v", err)
	}
}
