package dbscope_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// In the DB scope a poison record's writes are rolled back and it goes to
// the dead-letter topic; a business skip keeps what the handler wrote (a
// "declined" ledger row) and is not retried; the rest of the batch commits;
// the offsets end up committed past all of them.
func TestDBPoisonAndSkip(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "captures", "g-dbfail"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	vals := []string{"k1/0", "poison/0", "k2/0", "declined/0", "k3/0", "k1/1"}
	var recs []*kgo.Record
	for _, v := range vals {
		key, _, _ := testenv.ParseKeyed([]byte(v))
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(v)})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 1
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if err := insertEffect(ctx, tx, r); err != nil {
				return err
			}
			switch string(r.Key) {
			case "poison":
				return consumer.DecodeError(errors.New("amount is not a number"))
			case "declined":
				return consumer.Skip(errors.New("card declined"))
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every record done", time.Minute, func() bool { return r.Stats().Done == int64(len(vals)) })
	wantOutcomes(t, r, 4, 1, 1)
	keys := effectKeys(t, pool)
	for _, k := range keys {
		if k == "poison" {
			t.Fatal("the poison record's write survived")
		}
	}
	if len(keys) != 5 {
		t.Fatalf("effects %v: want the 4 applied records and the declined one", keys)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || string(dlt[0].Value) != "poison/0" || testenv.Header(dlt[0], retrytopic.HeaderErrorClass) != "terminal" {
		t.Fatalf("DLT %v", dlt)
	}
	// The poison record's writes were rolled back with it, and its inbox
	// row says it was dead-lettered: a redelivery of it is a no-op, a
	// redrive of the fixed record (with the redrive header) is applied.
	var status string
	pool.QueryRow(ctx, `SELECT status FROM kscope_inbox WHERE message_id = $1`, testenv.Header(dlt[0], consumer.HeaderID)).Scan(&status)
	if status != "dead" {
		t.Fatalf("the dead-lettered record's inbox row says %q, want dead", status)
	}
}

// A transient failure is retried in place, then through the retry topics,
// then succeeds: one effect. Meanwhile later records of its key are parked
// behind it and applied after it, in order; other keys are not held back.
func TestDBOrderedRetriesThroughRetryTopics(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "accounts", "g-ordered"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Failures = retrytopic.Policy{
		Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		InPlaceAttempts: 2, Ladder: []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}, RetryableAttempts: 10,
	}
	var mu sync.Mutex
	calls := map[string]int{}
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			mu.Lock()
			calls[string(r.Value)]++
			n := calls[string(r.Value)]
			mu.Unlock()
			if string(r.Value) == "K/0" && n <= 4 { // 2 in place, then 2 retry topics
				return consumer.Retryable(errors.New("ledger service 503"))
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	// K/0 first; K's later records and other keys' records after it.
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("K"), Value: []byte("K/0")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "K/0 in the retry topics", func() bool { return r.Stats().Failures.RetryTopic >= 1 })
	var later []*kgo.Record
	for i := 1; i <= 4; i++ {
		later = append(later, &kgo.Record{Topic: topic, Key: []byte("K"), Value: []byte(fmt.Sprintf("K/%d", i))})
		later = append(later, &kgo.Record{Topic: topic, Key: []byte("J"), Value: []byte(fmt.Sprintf("J/%d", i-1))})
	}
	if err := k.Produce(ctx, later...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "every record applied", func() bool { return r.Stats().DB.Applied == 9 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if calls["K/0"] != 5 {
		t.Fatalf("K/0 handled %d times, want 5 (2 in place, 2 retry topics, then success)", calls["K/0"])
	}
	if st := r.Stats().DB; st.Parked < 4 {
		t.Fatalf("stats %+v: K's later records were not parked behind K/0", st)
	}
	order := effectOrder(t, pool)
	var ks, js []string
	for _, v := range order {
		if strings.HasPrefix(v, "K/") {
			ks = append(ks, v)
		} else {
			js = append(js, v)
		}
	}
	if strings.Join(ks, ",") != "K/0,K/1,K/2,K/3,K/4" {
		t.Fatalf("K's effects in order %v", ks)
	}
	if len(js) != 4 || indexOf(order, "J/3") > indexOf(order, "K/0") {
		t.Fatalf("J waited for K's retries: %v", order)
	}
	c := countEffects(t, pool)
	if c.rows != 9 || c.unique != 9 {
		t.Fatalf("effects %+v, want 9", c)
	}
	var left int
	pool.QueryRow(ctx, `SELECT count(*) FROM kscope_parked`).Scan(&left)
	if left != 0 {
		t.Fatalf("%d parked rows left after every record was applied", left)
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// A parked key is released when its head goes to the dead-letter topic: the
// records waiting behind it are then applied, in order.
func TestDBParkedKeyReleasedByDLT(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "accounts", "g-release"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Failures = retrytopic.Policy{
		Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		InPlaceAttempts: 1, Ladder: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}, RetryableAttempts: 3,
	}
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if string(r.Value) == "K/0" {
				return consumer.Retryable(errors.New("never works"))
			}
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("K"), Value: []byte("K/0")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "K/0 in the retry topics", func() bool { return r.Stats().Failures.RetryTopic >= 1 })
	if err := k.Produce(ctx,
		&kgo.Record{Topic: topic, Key: []byte("K"), Value: []byte("K/1")},
		&kgo.Record{Topic: topic, Key: []byte("K"), Value: []byte("K/2")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "K/1 and K/2 applied", func() bool { return r.Stats().DB.Applied == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if r.Stats().Failures.DeadLettered != 1 {
		t.Fatalf("failures %+v: K/0 should be dead-lettered after 3 attempts", r.Stats().Failures)
	}
	if r.Stats().DB.Parked < 2 {
		t.Fatalf("stats %+v: K/1 and K/2 did not wait behind K/0", r.Stats().DB)
	}
	order := effectOrder(t, pool)
	if strings.Join(order, ",") != "K/1,K/2" {
		t.Fatalf("effects %v", order)
	}
	if dlt := k.ReadAll(t, retrytopic.DLTopic(group)); len(dlt) != 1 || string(dlt[0].Value) != "K/0" {
		t.Fatalf("DLT %v", dlt)
	}
	var left int
	pool.QueryRow(ctx, `SELECT count(*) FROM kscope_parked`).Scan(&left)
	if left != 0 {
		t.Fatalf("%d parked rows left", left)
	}
}
