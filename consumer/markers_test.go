package consumer_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// positionHook keeps the last lag reported per partition and counts the
// records reported fetched.
type positionHook struct {
	mu      sync.Mutex
	lag     map[int32]hook.Lag
	fetched atomic.Int64
}

func (h *positionHook) OnLag(l hook.Lag) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lag[l.Partition] = l
}

func (h *positionHook) OnPartitionGone(string, string, int32) {}

func (h *positionHook) OnFetch(f hook.Fetch) { h.fetched.Add(int64(f.Records)) }

// caughtUp reports whether every one of n partitions last reported no lag.
func (h *positionHook) caughtUp(n int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.lag) < n {
		return false
	}
	for _, l := range h.lag {
		if l.Offsets != 0 {
			return false
		}
	}
	return true
}

// A topic written by a transactional producer ends in a transaction
// marker: the runner commits past it, so a group that consumed every record
// shows no lag, to kscope's lag hooks and to the broker alike (before, it
// stopped one short, at the marker, on every such partition), and past the
// marker of a transaction that aborts after it caught up. Markers are
// neither handled nor counted as fetched records.
func TestTransactionMarkersAreCommittedPast(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic, group, partitions = "tx-input", "g-markers", 3
	if err := k.CreateTopic(ctx, topic, partitions); err != nil {
		t.Fatal(err)
	}
	total := len(k.ProduceInTransactions(t, "upstream", topic, partitions, 5, 4, func(x int) bool { return x%2 == 1 }))

	h := &positionHook{lag: map[int32]hook.Lag{}}
	var handled atomic.Int64
	var nonData atomic.Int64
	cfg := baseConfig(t, k, group, topic)
	cfg.Hooks = []hook.Hook{h}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		if rec.Attrs.IsControl() || len(rec.Value) == 0 {
			nonData.Add(1)
		}
		handled.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every committed record handled", func() bool { return handled.Load() >= int64(total) })
	testenv.WaitFor(t, 30*time.Second, "offsets committed past the last marker", func() bool { return k.CommittedAll(t, group, topic) })
	testenv.WaitFor(t, 30*time.Second, "no lag reported", func() bool { return h.caughtUp(partitions) })
	// A transaction that aborts now reaches the caught-up runner as a
	// marker alone (the client drops its records): the runner commits
	// past it too, with no record to handle.
	k.ProduceInTransactions(t, "upstream", topic, partitions, 1, 4, func(int) bool { return true })
	testenv.WaitFor(t, 30*time.Second, "offsets committed past the aborted transaction's markers", func() bool { return k.CommittedAll(t, group, topic) })
	testenv.WaitFor(t, 30*time.Second, "no lag reported after the aborted transaction", func() bool { return h.caughtUp(partitions) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := handled.Load(); n != int64(total) {
		t.Fatalf("handled %d records, want the %d committed ones", n, total)
	}
	if n := nonData.Load(); n != 0 {
		t.Fatalf("%d markers reached the handler", n)
	}
	if n := h.fetched.Load(); n != int64(total) {
		t.Fatalf("fetch hooks counted %d records, want the %d committed ones", n, total)
	}
	if s := r.Stats(); s.Polled != int64(total) || s.Done != int64(total) {
		t.Fatalf("stats: %d polled, %d done; want %d of each", s.Polled, s.Done, total)
	}
}
