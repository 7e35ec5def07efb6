package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/pausecheck"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// In the AtLeastOnce scope, a topic paused while its records flow is not
// handled until it is resumed, the other topic goes on, and a rebalance
// keeps it paused.
func TestPauseTopicAtLeastOnce(t *testing.T) {
	k := testenv.KafkaT(t)
	pausecheck.Run(t, k, "g-pause", func(cfg consumer.Config) (*consumer.Runner, error) {
		return consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	})
}

// Pauses are kept by target and reason: a resume of a topic ends its
// partitions' pauses too, a resume of one reason leaves the others, and
// a pause given a time ends by itself. They are kept before Run, to apply
// from the first assignment.
func TestPauseTargetsAndReasons(t *testing.T) {
	r, err := consumer.New(consumer.Config{Brokers: []string{"localhost:1"}, Group: "g", Topics: []string{"a", "b"}},
		consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	targets := func() []string {
		var out []string
		for _, p := range r.Paused() {
			out = append(out, p.Target.String()+"/"+p.Reason)
		}
		return out
	}
	want := func(w ...string) {
		t.Helper()
		if got := targets(); fmt.Sprint(got) != fmt.Sprint(w) {
			t.Fatalf("Paused() %v; want %v", got, w)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(r.Pause(consumer.Topic("a")))
	must(r.Pause(consumer.Partition("a", 1), consumer.PauseReason("breaker")))
	must(r.Pause(consumer.Topic("b")))
	must(r.Pause(consumer.Topic("a"))) // again: kept once
	want("a/user", "a[1]/breaker", "b/user")
	must(r.Resume(consumer.Topic("a"), consumer.PauseReason("user")))
	want("a[1]/breaker", "b/user")
	must(r.Resume(consumer.Topic("a")))
	want("b/user")
	must(r.Resume(consumer.All()))
	want()

	must(r.Pause(consumer.All(), consumer.PauseFor(50*time.Millisecond), consumer.PauseReason("breaker")))
	if ps := r.Paused(); len(ps) != 1 || ps[0].Until.IsZero() || ps[0].Target != consumer.All() {
		t.Fatalf("Paused() %+v; want all, with an end", ps)
	}
	if ps := r.Stats().Paused; len(ps) != 1 {
		t.Fatalf("Stats().Paused %+v; want the pause", ps)
	}
	testenv.WaitFor(t, 10*time.Second, "the pause to end by itself", func() bool { return len(r.Paused()) == 0 })

	for _, bad := range []consumer.Target{{}, consumer.Topic(""), consumer.Partition("a", -1)} {
		if err := r.Pause(bad); err == nil {
			t.Errorf("Pause(%v) = nil; want an error saying what the target lacks", bad)
		}
	}
	if err := consumer.PauseFrom(context.Background(), consumer.All()); !errors.Is(err, consumer.ErrNotHandlerContext) {
		t.Fatalf("PauseFrom(a context not a handler's) = %v; want ErrNotHandlerContext", err)
	}
}

// A handler's decision: a handler that finds its dependency down pauses
// its topic from its context (PauseFrom), for a reason; the records after
// are not handled until the service resumes the topic, and the other
// topic goes on.
func TestPauseFromHandler(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const down, other, group = "pf-down", "pf-other", "g-pause-from"
	for _, topic := range []string{down, other} {
		if err := k.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	handled := map[string]bool{}
	resumed := false
	var early []string
	r, err := consumer.New(baseConfig(t, k, group, down, other), consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		v := string(rec.Value)
		mu.Lock()
		handled[v] = true
		if rec.Topic == down && strings.HasPrefix(v, "after") && !resumed {
			early = append(early, v)
		}
		mu.Unlock()
		if v == "down" {
			return consumer.PauseFrom(ctx, consumer.Topic(rec.Topic), consumer.PauseReason("dependency"))
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	has := func(vs ...string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, v := range vs {
				if !handled[v] {
					return false
				}
			}
			return true
		}
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: down, Value: []byte("down")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the handler to pause its topic", func() bool { return len(r.Paused()) == 1 })
	if p := r.Paused()[0]; p.Target != consumer.Topic(down) || p.Reason != "dependency" {
		t.Fatalf("Paused() %+v; want topic %s, reason dependency", p, down)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: down, Value: []byte("after-1")}, &kgo.Record{Topic: other, Value: []byte("other-1")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the other topic handled", has("other-1"))
	mu.Lock()
	resumed = true
	mu.Unlock()
	if err := r.Resume(consumer.Topic(down)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the paused topic handled after the resume", has("after-1"))
	mu.Lock()
	defer mu.Unlock()
	if len(early) > 0 {
		t.Fatalf("handled before the resume: %v", early)
	}
}
