package consumer_test

import (
	"strconv"
	"sync/atomic"

	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// Records of one key are handled serially and in offset order, while
// different keys run concurrently on several shards.
func TestPerKeyOrderAndNoOverlap(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic, keys, perKey = "orders", 60, 40
	if err := k.CreateTopic(ctx, topic, 6); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, topic, keys, perKey)

	obs := testenv.NewObserver()
	concurrent := newGauge()
	cfg := baseConfig(t, k, "g-order", topic)
	cfg.Shards = 8
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		leave := obs.Enter(rec.Key)
		defer leave()
		concurrent.add(1)
		defer concurrent.add(-1)
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		obs.Record(rec.Value)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record handled", func() bool { return obs.Handled() >= int64(total) })
	testenv.WaitFor(t, 30*time.Second, "offsets committed to the end", func() bool { return k.CommittedAll(t, "g-order", topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := obs.Overlaps(); n != 0 {
		t.Fatalf("%d times two handlers ran at once for one key", n)
	}
	obs.CheckStrictOrder(t, keys, perKey)
	if concurrent.peak() < 2 {
		t.Fatalf("handlers never ran concurrently (peak %d): shards are not parallel", concurrent.peak())
	}
}

// Past the in-flight bound the runner stops taking records instead of
// buffering without limit, and takes them again as the work drains; a
// partition paused meanwhile (see TestHogs for which) is resumed.
func TestBackpressureBoundsInFlight(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic = "backlog"
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, topic, 40, 75) // 3000 records

	obs := testenv.NewObserver()
	cfg := baseConfig(t, k, "g-bp", topic)
	cfg.Shards = 4
	cfg.MaxInFlightRecords = 64
	cfg.MaxInFlightBytes = 1 << 30
	// The handlers are held at first, so that the bound holds for longer
	// than a burst.
	gate := make(chan struct{})
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		time.Sleep(100 * time.Microsecond)
		obs.Record(rec.Value)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the held bound reached", func() bool {
		return r.Stats().InFlight == int64(cfg.MaxInFlightRecords)
	})
	close(gate)
	testenv.WaitFor(t, 2*time.Minute, "the backlog drained", func() bool { return obs.Handled() >= int64(total) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := r.Stats()
	if st.MaxInFlight > int64(cfg.MaxInFlightRecords) {
		t.Fatalf("in-flight peaked at %d records, bound %d", st.MaxInFlight, cfg.MaxInFlightRecords)
	}
	if st.MaxInFlight < int64(cfg.MaxInFlightRecords)/2 {
		t.Fatalf("in-flight peaked at %d: the backlog never pushed against the bound of %d", st.MaxInFlight, cfg.MaxInFlightRecords)
	}
	if st.PausedPartitions != 0 || st.InFlight != 0 {
		t.Fatalf("after the drain: %d partitions still paused, %d records in flight", st.PausedPartitions, st.InFlight)
	}
	obs.CheckStrictOrder(t, 40, 75)
}

func TestBackpressureBoundsInFlightBytes(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic = "big-values"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	value := make([]byte, 4096)
	var recs []*kgo.Record
	for i := range 600 {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(strconv.Itoa(i % 30)), Value: value})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	cfg := baseConfig(t, k, "g-bytes", topic)
	cfg.Shards = 2
	cfg.MaxInFlightBytes = 64 << 10 // 16 records' worth
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		time.Sleep(200 * time.Microsecond)
		handled.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "every record handled", func() bool { return handled.Load() >= 600 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Polls are sized by the average record size seen, so with records of
	// one size the bound holds exactly.
	st := r.Stats()
	if st.MaxInFlightBytes > cfg.MaxInFlightBytes {
		t.Fatalf("in-flight bytes peaked at %d, bound %d", st.MaxInFlightBytes, cfg.MaxInFlightBytes)
	}
	if st.MaxInFlightBytes < cfg.MaxInFlightBytes/2 {
		t.Fatalf("in-flight bytes peaked at %d: the backlog never pushed against the bound of %d", st.MaxInFlightBytes, cfg.MaxInFlightBytes)
	}
}

// A record finished just before a handler that blocks is committed while
// that handler still runs: the runner may gather done reports, but never
// holds one back from an offset commit.
func TestDoneRecordCommitsWhileTheNextBlocks(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic, group = "slow-next", "g-slow-next"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 5 {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(strconv.Itoa(i))})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	cfg := baseConfig(t, k, group, topic)
	cfg.Shards = 1
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		if string(rec.Value) == "3" {
			select { // blocks until the test has seen offsets 0-2 committed
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	testenv.WaitFor(t, 30*time.Second, "offsets 0-2 committed while offset 3 blocks", func() bool {
		com, err := k.CommittedOffsets(ctx, group, topic)
		return err == nil && com[0] == 3
	})
	close(release)
	testenv.WaitFor(t, 30*time.Second, "every offset committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
