package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// A stop (Ctrl-C) says at once that it drains, and says again while a
// slow record keeps it waiting, instead of being silent until
// DrainTimeout.
func TestStopLogsTheDrain(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "drain-log", "g-drain-log"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	cfg := baseConfig(t, k, group, topic)
	cfg.Logger = logs.Logger()
	started := make(chan struct{})
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, _ *consumer.Record) error {
		close(started)
		time.Sleep(2500 * time.Millisecond) // a slow call that does not watch its context
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte("slow")}); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	for _, want := range []string{"kscope: stopping: no new records; finishing the running ones", "running=1",
		"kscope: draining: waiting for running records to finish"} {
		if !strings.Contains(out, want) {
			t.Errorf("the stop's log lacks %q:\n%s", want, out)
		}
	}
}

// 30 poison records make 10 ERROR lines and one line that counts the other
// 20, not 30 ERROR lines.
func TestDeadLetterLogIsRateLimited(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "dlt-log", "g-dlt-log"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	cfg := baseConfig(t, k, group, topic)
	cfg.Logger = logs.Logger()
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		return consumer.DecodeError(errors.New("not a payment"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	for i := range 30 {
		if err := k.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprint("poison-", i))}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, time.Minute, "30 records dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 30 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if n := strings.Count(out, `msg="kscope: record sent to the dead-letter topic"`); n != 10 {
		t.Errorf("%d ERROR lines for 30 dead letters, want 10:\n%s", n, out)
	}
	if !strings.Contains(out, "not_logged=20") {
		t.Errorf("no line counts the 20 dead letters not logged one by one:\n%s", out)
	}
}
