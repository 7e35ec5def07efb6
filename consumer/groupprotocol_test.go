package consumer_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// The protocol a runner is configured with is the one its client uses,
// under both protocols, and a second member's arrival (a rebalance that
// revokes partitions from the first) loses nothing, handles nothing twice
// and keeps every key's order: the revoked partitions are drained and their
// offsets committed before the new member takes them.
func TestGroupProtocolInUseAndRebalance(t *testing.T) {
	for _, proto := range []consumer.GroupProtocol{consumer.GroupProtocolClassic, consumer.GroupProtocolConsumer} {
		t.Run(string(proto), func(t *testing.T) {
			testGroupProtocolRebalance(t, proto)
		})
	}
}

func testGroupProtocolRebalance(t *testing.T, proto consumer.GroupProtocol) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic, keys, perKey = "orders", 40, 30
	group := "g-proto-" + string(proto)
	if err := k.CreateTopic(ctx, topic, 6); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, topic, keys, perKey)
	obs := testenv.NewObserver()
	member := func() *consumer.Runner {
		cfg := baseConfig(t, k, group, topic)
		cfg.GroupProtocol = proto
		r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
			leave := obs.Enter(rec.Key)
			defer leave()
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
			obs.Record(rec.Value)
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := member()
	stopA := runAsync(t, a)
	testenv.WaitFor(t, time.Minute, "the first member handling records", func() bool { return obs.Handled() > 0 })
	if got := a.Stats().GroupProtocol; got != proto {
		t.Fatalf("Stats().GroupProtocol = %q, want %q", got, proto)
	}
	b := member()
	stopB := runAsync(t, b)
	testenv.WaitFor(t, time.Minute, "both members assigned", func() bool {
		return a.Stats().Assigned > 0 && b.Stats().Assigned > 0
	})
	if got := b.Stats().GroupProtocol; got != proto {
		t.Fatalf("the second member's Stats().GroupProtocol = %q, want %q", got, proto)
	}
	testenv.WaitFor(t, time.Minute, "every record handled", func() bool { return obs.Handled() >= int64(total) })
	testenv.WaitFor(t, 30*time.Second, "offsets committed to the end", func() bool { return k.CommittedAll(t, group, topic) })
	for _, stop := range []func() error{stopB, stopA} {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	if n := obs.Overlaps(); n != 0 {
		t.Fatalf("%d times two handlers ran at once for one key", n)
	}
	obs.CheckStrictOrder(t, keys, perKey)
}
