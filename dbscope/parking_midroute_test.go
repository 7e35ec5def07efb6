package dbscope_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// behindMidRoute is how many records of key k wait behind its head B in
// TestDBHeadLeftMidRouteWithManyBehind: more than one release transaction
// reads (64).
const behindMidRoute = 69

// A head resolves and the record behind it, B, is released, fails and
// becomes the key's head, with 69 more records of the key waiting behind
// it; B's produce to the retry topic is refused until the partition is
// lost, which cuts the routing short. Nothing routes B any more: the next
// recovery pass leaves the head for a pass, and a release that meets it
// must end rather than read the same rows again without a wait. While the
// retry topic stays refused, the runner commits a few transactions a
// second at most; once it takes produces again, B is routed again and
// every record is applied once: in key order when failures park, and with
// only B out of order when the pipeline (a second deployment) parks no new
// failure. (Where failures park, B's parked row holds the key and no
// release reads its rows; the loop was the Unordered pipeline's.)
func TestDBHeadLeftMidRouteWithManyBehind(t *testing.T) {
	for _, unordered := range []bool{false, true} {
		name := "ordered"
		if unordered {
			name = "Unordered"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			k := testenv.KafkaT(t)
			pool := newPool(t)
			const topic = "payments"
			group := "g-midroute-" + name
			if err := k.CreateTopic(ctx, topic, 1); err != nil {
				t.Fatal(err)
			}
			cfg := baseConfig(k, group, topic)
			cfg.Shards = 1
			cfg.ClientOptions = []kgo.Opt{kgo.HeartbeatInterval(50 * time.Millisecond)}
			cfg.Failures = retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
				InPlaceAttempts: 1, Ladder: []time.Duration{time.Second}, RetryableAttempts: 10}
			failA := new(atomic.Bool)
			failA.Store(true)
			var bCalls atomic.Int32
			bFailed := make(chan struct{}, 1)
			h := dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
				switch string(r.Value) {
				case "k/0":
					if failA.Load() {
						return consumer.Retryable(errors.New("ledger 503"))
					}
				case "k/1":
					if bCalls.Add(1) == 1 {
						bFailed <- struct{}{}
						return consumer.Retryable(errors.New("ledger 503 again"))
					}
				}
				return insertEffect(ctx, tx, r)
			})
			r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, h)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, r)
			headInRetryTopic(t, k, r, topic)
			var behind []*kgo.Record
			for i := 1; i <= behindMidRoute+1; i++ {
				behind = append(behind, idRecord(topic, "k", fmt.Sprintf("k/%d", i), fmt.Sprintf("m%d", i)))
			}
			if err := k.Produce(ctx, behind...); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, time.Minute, "the records waiting behind A", func() bool { return r.Stats().DB.Parked >= int64(len(behind)) })
			if unordered {
				// A second deployment parks no new failure; A, parked by
				// the first, is still in the retry topic.
				testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
				if err := stop(); err != nil {
					t.Fatal(err)
				}
				cfg.Failures.Unordered = true
				if r, err = dbscope.New(cfg, dbscope.Options{Pool: pool}, h); err != nil {
					t.Fatal(err)
				}
				stop = run(t, r)
			}
			pf := cutRouteByLoss(t, k, r, group, func() { failA.Store(false) }, bFailed)
			testenv.WaitFor(t, time.Minute, "B left mid-route", func() bool {
				_, waiting, heads := parkingRows(t, pool)
				return heads == 1 && waiting == len(behind)
			})
			// Two recovery passes (every 2 s) find B left mid-route; the
			// first leaves it and releases the key, which meets B. Over
			// that time the runner has nothing to commit but a pass's
			// own transactions.
			before := r.Stats().DB.Transactions
			window := 5 * time.Second
			time.Sleep(window) // a measurement window, not a synchronisation
			if n := r.Stats().DB.Transactions - before; n > 25 {
				t.Fatalf("%d transactions committed in %v with nothing to apply: a release loops on the head left mid-route", n, window)
			}
			pf.Remove()
			want := []string{"k/0"}
			for _, rec := range behind {
				want = append(want, string(rec.Value))
			}
			if !unordered {
				waitAppliedInOrder(t, pool, time.Minute, want...)
			} else {
				// B travels the retry topic alone; the rest is released
				// behind nothing, in order.
				var got []string
				testenv.WaitFor(t, time.Minute, "every record applied, B after A", func() bool {
					got = effectOrder(t, pool)
					_, waiting, _ := parkingRows(t, pool)
					return len(got) == len(want) && waiting == 0
				})
				rest := slices.DeleteFunc(slices.Clone(got), func(e string) bool { return e == "k/1" })
				if got[0] != "k/0" || !slices.Equal(rest, slices.DeleteFunc(slices.Clone(want), func(e string) bool { return e == "k/1" })) {
					t.Fatalf("effects %q: want k/0 first and the records behind B in order", got)
				}
				if c := countEffects(t, pool); c.rows != len(want) || c.unique != len(want) {
					t.Fatalf("%d effects of %d records, want each of the %d applied once", c.rows, c.unique, len(want))
				}
			}
			testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
