package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/outbox"
)

// The broker commits a relay's transaction, but its answer comes after the
// relay stopped waiting (TransactionTimeout): the relay reads the
// partition's committed position again before it goes on, so the rows of
// that transaction are published once, not a second time in a new one.
func TestUnconfirmedCommitIsNotPublishedTwice(t *testing.T) {
	k, pool, _ := setup(t)
	if k.Cluster == nil {
		t.Skip("the slow coordinator needs the in-process kfake cluster")
	}
	var slowed atomic.Bool
	k.Cluster.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r := req.(*kmsg.EndTxnRequest)
		if !r.Commit || slowed.Swap(true) {
			return nil, nil, false
		}
		k.Cluster.DropControl()
		// The coordinator answers after the relay gave up on it; the
		// commit itself happens.
		time.Sleep(2500 * time.Millisecond)
		return nil, nil, false
	})
	w := outbox.Writer{Partitions: 1}
	want := writeStream(t, pool, w, "a", 2, 4)
	o := outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0}, Logger: logger(),
		PollInterval: 20 * time.Millisecond, TransactionTimeout: time.Second}
	r, stop := runRelay(t, o)
	ctx := context.Background()
	testenv.WaitFor(t, 30*time.Second, "every row published", func() bool {
		st, err := r.Pending(ctx)
		return err == nil && len(st) == 1 && st[0].Position == 4 && st[0].Pending == 0
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !slowed.Load() {
		t.Fatal("no commit met the slow coordinator")
	}
	checkExactlyOnce(t, k, want)
}

// A broker that fences the relay's producer (as it does when it aborts a
// transaction that outlived TransactionTimeout) does not stop the
// partition for good: with no other relay owning it, the relay takes it
// over again and publishes every row, once.
func TestFencedRelayTakesItsPartitionOverAgain(t *testing.T) {
	k, pool, _ := setup(t)
	h, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.ProducerFenced, Count: 1})
	if err != nil {
		t.Skip(err) // broker faults need the in-process kfake cluster
	}
	w := outbox.Writer{Partitions: 1}
	want := writeStream(t, pool, w, "a", 2, 4)
	o := outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0}, Logger: logger(),
		PollInterval: 20 * time.Millisecond}
	r, stop := runRelay(t, o)
	ctx := context.Background()
	if err := h.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "every row published after the fence", func() bool {
		st, err := r.Pending(ctx)
		return err == nil && len(st) == 1 && st[0].Position == 4 && st[0].Pending == 0
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, want)
}

// A broker that ends a relay's commit with a definite error that is not
// a fence (INVALID_TXN_STATE; INVALID_PRODUCER_ID_MAPPING, as when the
// coordinator expired the transactional id) leaves franz-go's producer
// failed for good: the relay takes the partition over again with a new
// producer, and every row is published once, instead of retrying the
// failed one forever while the partition waits.
func TestRelayReplacesAProducerFailedByItsCommit(t *testing.T) {
	for _, ferr := range []*kerr.Error{kerr.InvalidTxnState, kerr.InvalidProducerIDMapping} {
		t.Run(ferr.Message, func(t *testing.T) {
			k, pool, _ := setup(t)
			w := outbox.Writer{Partitions: 1}
			want := writeStream(t, pool, w, "a", 2, 4)
			h, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: ferr, Count: 1})
			if err != nil {
				t.Skip(err) // broker faults need the in-process kfake cluster
			}
			o := outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0}, Logger: logger(),
				PollInterval: 20 * time.Millisecond, BatchSize: 2}
			r, stop := runRelay(t, o)
			ctx := context.Background()
			if err := h.Wait(ctx, 1); err != nil {
				t.Fatal(err)
			}
			for key, vs := range writeStream(t, pool, w, "b", 2, 4) {
				want[key] = append(want[key], vs...)
			}
			testenv.WaitFor(t, 30*time.Second, "every row published after the failed commit", func() bool {
				st, err := r.Pending(ctx)
				return err == nil && len(st) == 1 && st[0].Position == 8 && st[0].Pending == 0
			})
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			checkExactlyOnce(t, k, want)
		})
	}
}
