package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// When the group takes a partition away without a revoke (the member was
// fenced), the runner commits nothing for it: another member may own it
// already. The running handler's context is canceled, and the record it was
// handling is delivered again, from the last commit, once the partition is
// assigned back.
func TestLostPartitionCommitsNothing(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic, group = "lost", "g-lost"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("0")}); err != nil {
		t.Fatal(err)
	}

	entered := make(chan struct{}, 1)
	var mu sync.Mutex
	deliveries := 0
	var firstCanceled bool
	cfg := baseConfig(t, k, group, topic)
	cfg.CommitInterval = time.Hour // only revoke or shutdown could commit
	cfg.ClientOptions = []kgo.Opt{kgo.HeartbeatInterval(50 * time.Millisecond)}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		mu.Lock()
		deliveries++
		n := deliveries
		mu.Unlock()
		if n == 1 {
			entered <- struct{}{}
			<-ctx.Done() // canceled when the partition is lost
			mu.Lock()
			firstCanceled = true
			mu.Unlock()
			return nil // a zombie that "succeeds" late: must not count
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	<-entered
	// The coordinator answers one heartbeat with UNKNOWN_MEMBER_ID: the
	// member was fenced, so its partitions are lost.
	if _, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{testenv.HeartbeatKey()}, Group: group, Err: kerr.UnknownMemberID}); err != nil {
		t.Skip(err) // broker faults need the in-process kfake cluster
	}
	testenv.WaitFor(t, time.Minute, "the partition to be lost", func() bool { return r.Stats().LostPartitions > 0 })
	testenv.WaitFor(t, time.Minute, "the record to be delivered again", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return deliveries >= 2
	})
	mu.Lock()
	canceled := firstCanceled
	mu.Unlock()
	if !canceled {
		t.Fatal("the handler running when the partition was lost kept its context")
	}
	com, err := k.CommittedOffsets(ctx, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	if com[0] != 0 {
		t.Fatalf("committed offset %d after a lost partition, before any revoke or shutdown", com[0])
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !k.CommittedAll(t, group, topic) {
		t.Fatal("the redelivered record's offset was not committed at shutdown")
	}
}
