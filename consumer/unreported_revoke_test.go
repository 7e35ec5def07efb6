package consumer_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// A Kafka-scope transaction holds the output of a record of partition
// in[0] when the runner ends that partition's assignment itself: franz-go's
// transactional session passes on one revoke or loss per transaction, so
// a partition revoked a second time arrives again in onAssigned with no
// revoke reported, and the session, which saw nothing, would commit. The
// transaction no longer commits in[0]'s offsets; committing the output
// without them would leave the record to be consumed and produced again
// by whoever reads in[0] from its committed offset. The transaction
// aborts instead: the record is consumed again and its output commits
// once, with its offset, and a runner that starts afresh on the group
// produces nothing more.
func TestPartitionEndedByTheRunnerAbortsTheOpenTransaction(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	for _, topic := range []string{"in", "out"} {
		if err := k.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
	}
	if k.Cluster == nil {
		t.Skip("the test observes requests of the in-process kfake cluster")
	}
	produced, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "out", Observe: true, Count: -1})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	h := txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
		calls.Add(1)
		out.Emit(&kgo.Record{Topic: "out", Key: r.Key, Value: r.Value})
		return nil
	})
	cfg := consumer.Config{Brokers: k.Brokers, Group: "g-unreported", Topics: []string{"in"}, Shards: 1}
	// Long enough for the test to end in[0]'s assignment while the
	// transaction is open: it ends 10 s after the record joined it, or
	// at once when an assignment ends.
	opts := txn.Options{TransactionalID: "unreported-1", CommitInterval: 10 * time.Second, TransactionTimeout: time.Minute}
	r, err := txn.New(cfg, opts, h)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(rctx) }()
	var once sync.Once
	var runErr error
	stop := func() error { once.Do(func() { cancel(); runErr = <-errc }); return runErr }
	t.Cleanup(func() { stop() })

	if err := k.Produce(ctx, &kgo.Record{Topic: "in", Key: []byte("k"), Value: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	if err := produced.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := consumer.AssignAgain(r.Runner, "in", 0); err != nil {
		t.Fatal(err)
	}

	testenv.WaitFor(t, time.Minute, "the record's output committed with its input offset", func() bool {
		return k.CommittedAll(t, "g-unreported", "in") && len(k.ReadAll(t, "out")) == 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want twice: once in the aborted transaction, once after", n)
	}
	// A new runner on the group starts from what committed.
	r2, err := txn.New(cfg, txn.Options{TransactionalID: "unreported-2"}, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(ctx)
	errc2 := make(chan error, 1)
	go func() { errc2 <- r2.Run(ctx2) }()
	testenv.WaitFor(t, time.Minute, "the new runner assigned", func() bool { return r2.Stats().Assigned > 0 })
	cancel2()
	if err := <-errc2; err != nil {
		t.Fatal(err)
	}
	if got := k.ReadAll(t, "out"); len(got) != 1 {
		t.Fatalf("%d outputs read_committed, want 1", len(got))
	}
}
