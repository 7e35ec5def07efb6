package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// handledValues is a handler that notes the values of the records it
// handles.
type handledValues struct {
	mu sync.Mutex
	m  map[string]bool
}

func (h *handledValues) Handle(_ context.Context, rec *consumer.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m[string(rec.Value)] = true
	return nil
}

// has returns a condition: the record of value v was handled.
func (h *handledValues) has(v string) func() bool {
	return func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.m[v]
	}
}

// A pause given PersistPause holds across a restart: the next process of
// the group starts with the topic paused, and once it is resumed there, a
// process after it starts unpaused.
func TestPersistedPauseHoldsAcrossARestart(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, other, group = "persist", "persist-other", "g-persist"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	if err := k.CreateTopic(ctx, other, 1); err != nil {
		t.Fatal(err)
	}
	seen := &handledValues{m: map[string]bool{}}
	newRunner := func() *consumer.Runner {
		r, err := consumer.New(baseConfig(t, k, group, topic, other), seen)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	has := seen.has

	r1 := newRunner()
	stop1 := runAsync(t, r1)
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the first record handled", has("first"))
	if err := r1.Pause(consumer.Topic(topic), consumer.PersistPause(), consumer.PauseReason("maintenance")); err != nil {
		t.Fatal(err)
	}
	if err := stop1(); err != nil {
		t.Fatal(err)
	}

	// The next process starts paused.
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte("while-down")}); err != nil {
		t.Fatal(err)
	}
	r2 := newRunner()
	stop2 := runAsync(t, r2)
	testenv.WaitFor(t, time.Minute, "the restarted runner assigned and paused", func() bool {
		ps := r2.Paused()
		return r2.Stats().Assigned == 3 && len(ps) == 1 && ps[0].Target == consumer.Topic(topic) && ps[0].Persisted && ps[0].Reason == "maintenance"
	})
	// The other topic flows; the paused one does not.
	if err := k.Produce(ctx, &kgo.Record{Topic: other, Value: []byte("other")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the other topic handled", has("other"))
	if has("while-down")() {
		t.Fatal("the restarted runner handled a record of the persisted paused topic")
	}
	if err := r2.Resume(consumer.Topic(topic)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the record handled after the resume", has("while-down"))
	if err := stop2(); err != nil {
		t.Fatal(err)
	}

	// Resumed there: the process after starts unpaused.
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	r3 := newRunner()
	runAsync(t, r3)
	testenv.WaitFor(t, time.Minute, "the third runner to handle the record", has("after"))
	if ps := r3.Paused(); len(ps) != 0 {
		t.Fatalf("Paused() %+v on the third runner; want none", ps)
	}
}
