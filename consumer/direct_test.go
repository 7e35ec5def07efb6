package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// directRun is what a user sees of one run of directScenario.
type directRun struct {
	calls    map[string]int // handler calls per value
	order    map[string][]string
	failures consumer.FailureStats
	dlt      []string // value/attempt/class of each DLT record, sorted
	outcomes map[hook.Outcome]int
}

// directScenario runs one record of each failure class (and one that
// panics once) through a runner, with a record hook or without one. Without
// hooks (and without any other feature of a handler call) the AtLeastOnce
// scope calls the handler itself; a hook makes every call go through the
// engine. Both must end alike.
func directScenario(t *testing.T, k *testenv.Kafka, name string, hooked bool) directRun {
	t.Helper()
	ctx := context.Background()
	topic, group := "direct-"+name, "g-direct-"+name
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	values := []string{"ok-1", "poison", "after-poison", "declined", "flaky", "after-flaky", "panics", "after-panics", "broken", "ok-2"}
	keys := map[string]string{"poison": "a", "after-poison": "a", "flaky": "b", "after-flaky": "b", "panics": "c", "after-panics": "c"}
	var recs []*kgo.Record
	for _, v := range values {
		key := keys[v]
		if key == "" {
			key = v
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(v)})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	run := directRun{calls: map[string]int{}, order: map[string][]string{}}
	var mu sync.Mutex
	cfg := baseConfig(t, k, group, topic)
	cfg.Failures = fastFailures(retrytopic.Policy{})
	o := &outcomes{}
	if hooked {
		cfg.Hooks = []hook.Hook{o}
	}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		v := string(rec.Value)
		mu.Lock()
		run.calls[v]++
		n := run.calls[v]
		mu.Unlock()
		switch {
		case v == "poison":
			return consumer.DecodeError(errors.New("invalid JSON"))
		case v == "declined":
			return consumer.Skip(errors.New("card declined"))
		case v == "flaky" && n < 3:
			return consumer.Retryable(errors.New("gateway 503"))
		case v == "panics" && n == 1:
			panic("nil map")
		case v == "broken":
			return errors.New("nil pointer somewhere")
		}
		mu.Lock()
		run.order[string(rec.Key)] = append(run.order[string(rec.Key)], v)
		mu.Unlock()
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == int64(len(recs)) })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	run.failures = r.Stats().Failures
	for _, d := range k.ReadAll(t, retrytopic.DLTopic(group)) {
		run.dlt = append(run.dlt, fmt.Sprintf("%s/%s/%s", d.Value, testenv.Header(d, retrytopic.HeaderAttempt), testenv.Header(d, retrytopic.HeaderErrorClass)))
	}
	slices.Sort(run.dlt)
	if hooked {
		o.mu.Lock()
		run.outcomes = maps.Clone(o.n)
		o.mu.Unlock()
	}
	return run
}

// A runner with no feature of a handler call configured (no record hooks,
// admission rules, rate limits, breakers or HandlerTimeout) calls the
// handler without the engine's wrapping; a record's first failure then
// goes on through the same failure policy. Each failure class (a panic
// included) ends as it does through the engine: the same calls, order,
// failure counts and dead-letter records.
func TestDirectCallsEndAsTheEngines(t *testing.T) {
	k := testenv.KafkaT(t)
	direct := directScenario(t, k, "plain", false)
	engine := directScenario(t, k, "hooked", true)

	want := map[string]int{"flaky": 3, "panics": 2, "broken": retrytopic.DefaultUnknownAttempts, "poison": 1, "declined": 1}
	for v, n := range want {
		if direct.calls[v] != n {
			t.Errorf("direct path: %s handled %d times, want %d", v, direct.calls[v], n)
		}
	}
	for key, seq := range map[string]string{"b": "flaky,after-flaky", "c": "panics,after-panics", "a": "after-poison"} {
		if got := strings.Join(direct.order[key], ","); got != seq {
			t.Errorf("direct path: key %s handled as %s, want %s", key, got, seq)
		}
	}
	if direct.failures.DeadLettered != 2 || direct.failures.Skipped != 1 {
		t.Errorf("direct path: failure stats %+v, want 2 dead-lettered (poison, broken) and 1 skipped", direct.failures)
	}
	if fmt.Sprint(direct.calls) != fmt.Sprint(engine.calls) {
		t.Errorf("handler calls differ: direct %v, through the engine %v", direct.calls, engine.calls)
	}
	if fmt.Sprint(direct.order) != fmt.Sprint(engine.order) {
		t.Errorf("per-key order differs: direct %v, through the engine %v", direct.order, engine.order)
	}
	if direct.failures != engine.failures {
		t.Errorf("failure stats differ: direct %+v, through the engine %+v", direct.failures, engine.failures)
	}
	if fmt.Sprint(direct.dlt) != fmt.Sprint(engine.dlt) {
		t.Errorf("dead-letter records differ: direct %v, through the engine %v", direct.dlt, engine.dlt)
	}
	if got := engine.outcomes; got[hook.OutcomeSuccess] != 7 || got[hook.OutcomeDeadLettered] != 2 || got[hook.OutcomeSkipped] != 1 {
		t.Errorf("the hooked run's outcomes %v: want 7 successes, 2 dead-lettered, 1 skipped", got)
	}
}
