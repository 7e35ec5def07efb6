package txn_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// A Kafka-scope handler that hangs is named by the stall watch, as in the
// other scopes; once it returns, its input and everything else commit,
// every output once.
func TestHungKafkaScopeHandlerIsNamed(t *testing.T) {
	k := setup(t)
	inputs := produceInputs(t, k, 40, 0)
	if err := k.Produce(context.Background(), &kgo.Record{Topic: "in", Key: []byte("hangs"), Value: []byte("order-hangs")}); err != nil {
		t.Fatal(err)
	}
	inputs = append(inputs, "order-hangs")
	release := make(chan struct{})
	defer close(release)
	stalls := &testenv.Stalls{}
	cfg := config(k, "stall")
	cfg.StallWarning = 300 * time.Millisecond
	cfg.Hooks = []hook.Hook{stalls}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "stall-1"}, txn.HandlerFunc(
		func(ctx context.Context, rec *consumer.Record, out txn.Emitter) error {
			if string(rec.Key) == "hangs" {
				<-release // ignores its context
			}
			return enrich.Handle(ctx, rec, out)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, time.Minute, "the stall reported", func() bool { return len(stalls.All()) > 0 })
	got := stalls.All()[0]
	held := k.ReadAll(t, "in")
	var want *kgo.Record
	for _, rec := range held {
		if string(rec.Key) == "hangs" {
			want = rec
		}
	}
	if got.Ended || got.Topic != "in" || got.Partition != want.Partition || got.Offset != want.Offset {
		t.Fatalf("stall reported as %+v; want in[%d]@%d, the record whose handler hangs", got, want.Partition, want.Offset)
	}
	release <- struct{}{}
	testenv.WaitFor(t, time.Minute, "every input committed", func() bool { return r.Stats().Kafka.Records == int64(len(inputs)) })
	testenv.WaitFor(t, time.Minute, "the stall's end reported", func() bool { return len(stalls.All()) == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, inputs)
}
