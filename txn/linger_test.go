package txn_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// The Kafka scope's producer lingers for the commit interval when a
// records rate limit bounds a transaction's inputs (its outputs go in a
// few produce requests, as no reader sees them before the commit), keeps
// franz-go's default otherwise, and a linger the user sets in
// ClientOptions wins either way.
func TestProducerLingerUnderARateLimit(t *testing.T) {
	k := setup(t)
	const interval = 200 * time.Millisecond
	cases := []struct {
		name  string
		limit float64 // records a second; 0: none
		user  time.Duration
		want  time.Duration
	}{
		{"no limit: the client's default", 0, 0, 10 * time.Millisecond},
		{"a limit of 200 a second: the commit interval", 200, 0, interval},
		{"a limit letting 10,000 records into a transaction: the default", 50_000, 0, 10 * time.Millisecond},
		{"the user's linger wins", 200, 5 * time.Millisecond, 5 * time.Millisecond},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := config(k, "g-linger")
			cfg.RateLimit.Records.PerSecond = c.limit
			if c.user > 0 {
				cfg.ClientOptions = append(cfg.ClientOptions, kgo.ProducerLinger(c.user))
			}
			r, err := txn.New(cfg, txn.Options{TransactionalID: "linger-" + string(rune('a'+i)), CommitInterval: interval},
				txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error { return nil }))
			if err != nil {
				t.Fatal(err)
			}
			stop := runFor(t, r)
			testenv.WaitFor(t, time.Minute, "the runner's client", func() bool { return r.Client() != nil })
			if got := r.Client().OptValue(kgo.ProducerLinger); got != c.want {
				t.Errorf("the producer lingers %v; want %v", got, c.want)
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Ending a transaction sends what lingers in the producer at once: under
// a linger of a minute, every input's output commits within its commit
// interval's transactions. Waiting for the produces without sending them
// kept every key-shard at the gate for the linger, each transaction:
// 10ms with franz-go's default (r5's Kafka scope ran at 576,000 records
// a second with that wait, 686,000 without it), the commit interval under
// a records rate limit.
func TestTransactionEndSendsWhatLingers(t *testing.T) {
	k := setup(t)
	cfg := config(k, "g-linger-end")
	cfg.ClientOptions = append(cfg.ClientOptions, kgo.ProducerLinger(time.Minute))
	r, err := txn.New(cfg, txn.Options{TransactionalID: "linger-end", CommitInterval: 100 * time.Millisecond},
		txn.HandlerFunc(func(_ context.Context, rec *consumer.Record, e txn.Emitter) error {
			e.Emit(&kgo.Record{Topic: "out", Key: rec.Key, Value: rec.Value})
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	inputs := produceInputs(t, k, 50, 0)
	stop := runFor(t, r)
	testenv.WaitFor(t, 20*time.Second, "every input's offset committed, before the producer's linger of a minute ends", func() bool {
		return k.CaughtUp(context.Background(), "g-linger-end", "in")
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, rec := range k.ReadAll(t, "out") {
		got[string(rec.Value)]++
	}
	for _, in := range inputs {
		if got[in] != 1 {
			t.Fatalf("output of %s committed %d times; want once", in, got[in])
		}
	}
	if len(got) != len(inputs) {
		t.Fatalf("%d distinct outputs committed; want %d", len(got), len(inputs))
	}
}
