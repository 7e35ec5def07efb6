package consumer

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/scope"
	"github.com/twmb/franz-go/pkg/kgo"
)

// delayTxnScope is a transactional scope whose topic "d" is a delay topic:
// the runner holds its records until their due time, pausing the partition.
type delayTxnScope struct{ txnStub }

func (delayTxnScope) Process(_ context.Context, batch []*Record, done func(*Record)) {
	for _, r := range batch {
		done(r)
	}
}

var _ scope.Transactor[*Record] = delayTxnScope{} // the runner finds it by this interface

func (delayTxnScope) DelayedTopics() map[string]time.Duration {
	return map[string]time.Duration{"d": time.Hour}
}

// A transactional runner's rebalance does not wait for the poll loop, so a
// partition can be revoked while the poll loop dispatches its records. A
// revoke that ends (its held records dropped, the partition resumed)
// before the dispatch reaches the records it would hold must not leave
// them held, or the partition paused: the client keeps a pause across
// rebalances, and the partition, assigned to this member again, would
// never be fetched.
func TestRevokeMidDispatchLeavesNothingHeldOrPaused(t *testing.T) {
	cases := []struct {
		name string
		recs func() []*kgo.Record
	}{
		{"records not due yet", func() []*kgo.Record {
			due := []byte(strconv.FormatInt(time.Now().Add(30*time.Minute).UnixMilli(), 10))
			recs := make([]*kgo.Record, 10)
			for i := range recs {
				recs[i] = &kgo.Record{Topic: "d", Offset: int64(i), Key: []byte("k" + strconv.Itoa(i)),
					Headers: []kgo.RecordHeader{{Key: HeaderDue, Value: due}}}
			}
			return recs
		}},
		{"more records than a transaction may leave undone", func() []*kgo.Record {
			recs := make([]*kgo.Record, 1000)
			for i := range recs {
				recs[i] = &kgo.Record{Topic: "d", Offset: int64(i), Key: []byte("k" + strconv.Itoa(i))}
			}
			return recs
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, cl := offlineRunner(t, []string{"d"}, delayTxnScope{})
			ctx := context.Background()
			d0 := map[string][]int32{"d": {0}}
			r.onAssigned(ctx, cl, d0)

			beforeHoldHook = func() { r.onRevoked(ctx, cl, d0) }
			defer func() { beforeHoldHook = nil }()
			recs := c.recs()
			r.dispatchAll("d", 0, int64(len(recs)), recs)
			beforeHoldHook = nil

			if held := r.held.Load(); held != 0 {
				t.Errorf("%d records held for the revoked partition; want none", held)
			}
			if in := r.inflight.Load(); in != 0 {
				t.Errorf("%d records count against the in-flight bound after the revoke; want 0", in)
			}
			r.onAssigned(ctx, cl, d0) // assigned to this member again
			if paused := cl.PauseFetchPartitions(nil); len(paused["d"]) > 0 {
				t.Fatalf("d[0] is still paused in the client after the revoke and a new assignment (%v): it would never be fetched again", paused)
			}
		})
	}
}

// offlineRunner returns a runner of scope sc on topics, with its worker
// pool started and a client that reaches no broker: the poll loop's
// dispatch is driven by the test. Both stop when the test ends.
func offlineRunner(t *testing.T, topics []string, sc workScope) (*Runner, *kgo.Client) {
	t.Helper()
	r, err := newRunner(Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: topics, Shards: 4, Logger: slog.New(slog.DiscardHandler)}.WithDefaults(), sc)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	r.cl = cl
	r.hardCtx = context.Background()
	r.shardBuf = make([][]*Record, r.cfg.Shards)
	r.newPool()
	r.pool.Start()
	t.Cleanup(r.pool.Stop)
	return r, cl
}

// franz-go's transactional session reports one revoke (or loss) per
// transaction: a second one before the transaction ends is not passed on.
// A partition revoked that way and assigned to this member again arrives
// in onAssigned while its earlier assignment still runs. That assignment
// must end as a lost one would: its held records dropped, its pause
// lifted, nothing of it counted in flight, and the scope told it is gone.
// Otherwise the partition, paused in the client, is never fetched again.
func TestAssignmentWithoutItsRevokeEndsTheEarlierOne(t *testing.T) {
	sc := &goneRecorder{}
	r, cl := offlineRunner(t, []string{"d"}, sc)
	ctx := context.Background()
	d0 := map[string][]int32{"d": {0}}
	r.onAssigned(ctx, cl, d0)

	due := []byte(strconv.FormatInt(time.Now().Add(30*time.Minute).UnixMilli(), 10))
	recs := make([]*kgo.Record, 10)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: "d", Offset: int64(i), Key: []byte("k" + strconv.Itoa(i)),
			Headers: []kgo.RecordHeader{{Key: HeaderDue, Value: due}}}
	}
	r.dispatchAll("d", 0, int64(len(recs)), recs)
	if held := r.held.Load(); held != 10 {
		t.Fatalf("%d records held before the second assignment; want 10 (the test no longer sets up what it checks)", held)
	}
	if paused := cl.PauseFetchPartitions(nil); len(paused["d"]) == 0 {
		t.Fatal("d[0] is not paused while its head record waits (the test no longer sets up what it checks)")
	}
	old := r.parts[tp{"d", 0}]

	r.onAssigned(ctx, cl, d0) // its revoke was never reported

	if held := r.held.Load(); held != 0 {
		t.Errorf("%d records held after the partition was assigned again; want none (the new assignment fetches them again)", held)
	}
	if in := r.inflight.Load(); in != 0 {
		t.Errorf("%d records count against the in-flight bound; want 0", in)
	}
	if paused := cl.PauseFetchPartitions(nil); len(paused["d"]) > 0 {
		t.Errorf("d[0] is still paused in the client after it was assigned again (%v): it would never be fetched", paused)
	}
	if !old.Revoked() {
		t.Error("the earlier assignment still runs: its records could still start")
	}
	if st := r.parts[tp{"d", 0}]; st == nil || st == old {
		t.Error("d[0] has no fresh assignment")
	}
	if got := sc.gone(); len(got["d"]) != 1 {
		t.Errorf("the scope was told %v gone; want d[0]: its open transaction's work for the earlier assignment must not commit", got)
	}
}

// goneRecorder is delayTxnScope, recording the partitions it was told gone.
type goneRecorder struct {
	delayTxnScope
	mu  sync.Mutex
	got map[string][]int32
}

func (g *goneRecorder) TxnGone(ps map[string][]int32, _ bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.got == nil {
		g.got = make(map[string][]int32)
	}
	for t, p := range ps {
		g.got[t] = append(g.got[t], p...)
	}
}

func (g *goneRecorder) gone() map[string][]int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.got
}
