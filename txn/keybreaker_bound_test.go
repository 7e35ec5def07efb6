package txn_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// In the Kafka scope, a held key's records count against
// MaxInFlightRecords: a key held with a backlog larger than the bound
// fills the room and the runner stops fetching rather than growing; the
// other keys fetched with it flow and commit; once the key's probe
// succeeds its records are served in order, and each input's output is
// committed once.
func TestKeyBreakerHeldRecordsCountAgainstInFlightKafka(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, out, group = "kb-bound-in", "kb-bound-out", "g-kafka-kb-bound"
	const limit, bad, others = 50, 120, 40
	for _, tp := range []string{topic, out} {
		if err := k.CreateTopic(ctx, tp, 1); err != nil {
			t.Fatal(err)
		}
	}
	var recs []*kgo.Record
	add := func(key, value string) {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value)})
	}
	add("bad", "bad-0")
	for i := range others / 2 {
		add(fmt.Sprintf("o%d", i), fmt.Sprintf("ok-%d", i))
	}
	for i := 1; i < bad; i++ {
		add("bad", fmt.Sprintf("bad-%d", i))
	}
	for i := others / 2; i < others; i++ {
		add(fmt.Sprintf("o%d", i), fmt.Sprintf("ok-%d", i))
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	errDown := errors.New("the key's dependency is down")
	var down atomic.Bool
	down.Store(true)
	var okServed, badServed atomic.Int64
	cfg := config(k, group)
	cfg.Topics = []string{topic}
	cfg.MaxInFlightRecords = limit
	cfg.Shards = 8
	cfg.KeyBreaker = &consumer.KeyBreakerConfig{OpenFor: 500 * time.Millisecond, MaxOpenFor: time.Second}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "kafka-kb-bound-1"}, txn.HandlerFunc(func(_ context.Context, rec *consumer.Record, em txn.Emitter) error {
		if string(rec.Key) == "bad" {
			if down.Load() {
				return errDown
			}
			badServed.Add(1)
		} else {
			okServed.Add(1)
		}
		em.Emit(&kgo.Record{Topic: out, Key: rec.Key, Value: rec.Value})
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, time.Minute, "the held key's records filling the room", func() bool {
		st := r.Stats()
		return st.KeyBreaker.HeldKeys == 1 && st.KeyBreaker.HeldRecords > limit/2 && okServed.Load() >= others/2
	})
	// Sample a while: the runner does not fetch past the bound.
	polled := r.Stats().Polled
	for range 20 {
		if st := r.Stats(); st.InFlight+st.Held > limit || st.Polled != polled {
			t.Fatalf("InFlight %d, Held %d, Polled %d (was %d) with the held key filling the room; want no fetch past the bound of %d", st.InFlight, st.Held, st.Polled, polled, limit)
		}
		time.Sleep(50 * time.Millisecond) // sampling, not synchronisation
	}
	down.Store(false)
	testenv.WaitFor(t, time.Minute, "every input's output committed", func() bool {
		return r.Stats().Kafka.Records == int64(bad+others)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	var badOrder []string
	for _, rec := range k.ReadAll(t, out) {
		v := string(rec.Value)
		seen[v]++
		if strings.HasPrefix(v, "bad-") {
			badOrder = append(badOrder, v)
		}
	}
	want := make([]string, bad)
	for i := range want {
		want[i] = fmt.Sprintf("bad-%d", i)
	}
	if !slices.Equal(badOrder, want) {
		t.Errorf("the held key's outputs committed as %s; want bad-0 to bad-%d, in order, once each", strings.Join(badOrder, ","), bad-1)
	}
	if len(seen) != bad+others {
		t.Errorf("%d distinct outputs; want %d", len(seen), bad+others)
	}
	for v, n := range seen {
		if n != 1 {
			t.Errorf("output %s committed %d times; want once", v, n)
		}
	}
	if st := r.Stats(); st.MaxInFlight > limit {
		t.Errorf("Stats.MaxInFlight %d; want at most MaxInFlightRecords (%d)", st.MaxInFlight, limit)
	}
}
