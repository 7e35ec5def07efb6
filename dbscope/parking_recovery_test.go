package dbscope_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// parkingRows returns how many parked and waiting rows the database holds,
// and how many of the waiting ones are marked as their key's head.
func parkingRows(t testing.TB, pool *pgxpool.Pool) (parked, waiting, heads int) {
	t.Helper()
	ctx := context.Background()
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kscope_parked`).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE head) FROM kscope_waiting`).Scan(&waiting, &heads); err != nil {
		t.Fatal(err)
	}
	return parked, waiting, heads
}

// parkBehindRetry runs a first deployment of the DB scope on topic: its
// handler fails k/0 (A), which goes to the retry topic of ladder's one
// rung, and k/1 (B) of the same key waits behind it in kscope_waiting; it
// returns once their offsets are committed and the runner stopped, with
// the deployment's config, its handler, and the switch that makes A fail
// (on until the test turns it off).
func parkBehindRetry(t *testing.T, k *testenv.Kafka, pool *pgxpool.Pool, group, topic string, rung time.Duration) (consumer.Config, dbscope.Handler, *atomic.Bool) {
	t.Helper()
	ctx := context.Background()
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Failures = retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		InPlaceAttempts: 1, Ladder: []time.Duration{rung}, RetryableAttempts: 10}
	fail := new(atomic.Bool)
	fail.Store(true)
	h := dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		if string(r.Value) == "k/0" && fail.Load() {
			return consumer.Retryable(errors.New("ledger 503"))
		}
		return insertEffect(ctx, tx, r)
	})
	r1, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, h)
	if err != nil {
		t.Fatal(err)
	}
	stop1 := run(t, r1)
	headInRetryTopic(t, k, r1, topic)
	if err := k.Produce(ctx, idRecord(topic, "k", "k/1", "B")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "B waiting", func() bool { return r1.Stats().DB.Parked >= 1 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop1(); err != nil {
		t.Fatal(err)
	}
	return cfg, h, fail
}

// waitAppliedInOrder waits until the effects are want, in that order, each
// applied once, and no parked or waiting row is left. On a timeout it
// reports what it last saw.
func waitAppliedInOrder(t *testing.T, pool *pgxpool.Pool, within time.Duration, want ...string) {
	t.Helper()
	var got []string
	var parked, waiting, heads int
	defer func() {
		if t.Failed() {
			t.Logf("effects %q, want %q; parked rows %d, waiting rows %d (heads %d)", got, want, parked, waiting, heads)
		}
	}()
	testenv.WaitFor(t, within, "every record applied once, in key order, with no parked or waiting row left", func() bool {
		got = effectOrder(t, pool)
		parked, waiting, heads = parkingRows(t, pool)
		return slices.Equal(got, want) && parked == 0 && waiting == 0
	})
	if c := countEffects(t, pool); c.rows != len(want) || c.unique != len(want) {
		t.Fatalf("%d effects of %d records, want each of the %d applied once", c.rows, c.unique, len(want))
	}
}

// A deployment with ordered retries leaves A in a retry topic and B
// waiting behind it in PostgreSQL; the next deployment turns ordering off.
// A, B and a newer C of the same key are each applied once, in that order:
// the records the earlier deployment parked are neither lost nor
// overtaken, whatever the new policy.
func TestDBOrderingTurnedOffKeepsParkedRecords(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy func(*retrytopic.Policy)
	}{
		{"DisableRetryTopics", func(p *retrytopic.Policy) { p.DisableRetryTopics = true }},
		{"Unordered", func(p *retrytopic.Policy) { p.Unordered = true }},
		{"EmptyLadder", func(p *retrytopic.Policy) { p.Ladder = []time.Duration{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			k := testenv.KafkaT(t)
			pool := newPool(t)
			const topic = "payments"
			group := "g-ordering-off-" + tc.name
			cfg, h, fail := parkBehindRetry(t, k, pool, group, topic, 3*time.Second)
			if parked, waiting, _ := parkingRows(t, pool); parked != 1 || waiting != 1 {
				t.Fatalf("after the first deployment: %d parked and %d waiting rows, want A parked and B waiting", parked, waiting)
			}
			fail.Store(false)

			cfg2 := cfg
			tc.policy(&cfg2.Failures)
			r2, err := dbscope.New(cfg2, dbscope.Options{Pool: pool}, h)
			if err != nil {
				t.Fatal(err)
			}
			stop2 := run(t, r2)
			if err := k.Produce(ctx, idRecord(topic, "k", "k/2", "C")); err != nil {
				t.Fatal(err)
			}
			waitAppliedInOrder(t, pool, 30*time.Second, "k/0", "k/1", "k/2")
			if err := stop2(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A head resolves and the record waiting behind it, B, is released, fails
// and becomes the key's new head; its produce to the retry topic is refused
// until the partition is lost, which cuts the routing short. The process
// goes on: B is routed again without a restart, and B and a newer C are
// applied after A, each once.
func TestDBReleasedHeadCutByLostPartitionIsRoutedAgain(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "payments", "g-lost-head"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1 // one serial worker: a record it handles proves the one before it returned
	cfg.ClientOptions = []kgo.Opt{kgo.HeartbeatInterval(50 * time.Millisecond)}
	cfg.Failures = retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		InPlaceAttempts: 1, Ladder: []time.Duration{time.Second}, RetryableAttempts: 10}
	var aCalls, bCalls atomic.Int32
	bFailed := make(chan struct{}, 1)
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			switch string(r.Value) {
			case "k/0":
				if aCalls.Add(1) == 1 {
					return consumer.Retryable(errors.New("ledger 503"))
				}
			case "k/1":
				if bCalls.Add(1) == 1 {
					bFailed <- struct{}{}
					return consumer.Retryable(errors.New("ledger 503 again"))
				}
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	headInRetryTopic(t, k, r, topic)
	if err := k.Produce(ctx, idRecord(topic, "k", "k/1", "B")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "B waiting", func() bool { return r.Stats().DB.Parked >= 1 })
	pf := cutRouteByLoss(t, k, r, group, nil, bFailed)
	// C is stored behind B by the only worker, once the release it ran
	// gave up routing B.
	if err := k.Produce(ctx, idRecord(topic, "k", "k/2", "C")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "C waiting behind B", func() bool { return r.Stats().DB.Parked >= 2 })
	if _, waiting, heads := parkingRows(t, pool); waiting != 2 || heads != 1 {
		t.Fatalf("%d waiting rows (%d heads), want B, whose routing was cut, and C behind it", waiting, heads)
	}
	pf.Remove()
	waitAppliedInOrder(t, pool, 30*time.Second, "k/0", "k/1", "k/2")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// cutRouteByLoss refuses every produce to the group's retry topic of one
// second, calls release (when not nil: what lets B, the record behind the
// key's head, be released), waits until B failed (bFailed) and its
// produce was refused, then makes the member lose its partitions: B's
// routing is cut short, and B is left as its key's head mid-route. It
// returns the fault, for the test to remove.
func cutRouteByLoss(t *testing.T, k *testenv.Kafka, r interface{ Stats() consumer.Stats }, group string, release func(), bFailed <-chan struct{}) *kfake.FaultHandle {
	t.Helper()
	rt := retrytopic.RetryTopic(group, time.Second)
	pf, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: rt, Err: kerr.TopicAuthorizationFailed, Count: -1})
	if err != nil {
		t.Skip(err)
	}
	if release != nil {
		release()
	}
	select {
	case <-bFailed:
	case <-time.After(time.Minute):
		t.Fatal("B was not released")
	}
	if err := pf.Wait(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{testenv.HeartbeatKey()}, Group: group, Err: kerr.UnknownMemberID}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the partitions lost", func() bool { return r.Stats().LostPartitions > 0 })
	return pf
}
