package consumer_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

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
	total := produceKeyed(t, k, topic, keys, perKey)

	obs := newObserver()
	concurrent := newGauge()
	cfg := baseConfig(t, k, "g-order", topic)
	cfg.Shards = 8
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		leave := obs.enter(rec)
		defer leave()
		concurrent.add(1)
		defer concurrent.add(-1)
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		obs.record(rec)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runAsync(t, r)
	waitFor(t, time.Minute, "every record handled", func() bool { return obs.handled.Load() >= int64(total) })
	waitFor(t, 30*time.Second, "offsets committed to the end", func() bool { return committedAll(t, k, "g-order", topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := obs.overlaps.Load(); n != 0 {
		t.Fatalf("%d times two handlers ran at once for one key", n)
	}
	obs.checkStrictOrder(t, keys, perKey)
	if concurrent.peak() < 2 {
		t.Fatalf("handlers never ran concurrently (peak %d): shards are not parallel", concurrent.peak())
	}
}
