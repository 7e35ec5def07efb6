package kscopeprom_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/internal/testmain"
	"github.com/kscope-dev/kscope/kscopeprom"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/txn"
)

func TestMain(m *testing.M) {
	testmain.Main(m)
}

// value returns the sum of the samples of metric name whose labels include
// want.
func value(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !matches(m, want) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func matches(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// series counts the samples of metric name.
func series(t *testing.T, g prometheus.Gatherer, name string) int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// A DB-scope scenario with known counts: N records succeed, D are
// redelivered duplicates, one flaky record fails twice (two hops through
// the retry topic) before it succeeds, P are poison. The registry shows
// exactly those counts, the lag gauges show the backlog while a gate holds
// the handler, and move to zero once it is drained.
func TestScrapedCountsMatchTheScenario(t *testing.T) {
	const n, d, p = 40, 7, 3
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "payments", "ledger"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	pcfg, err := pgxpool.ParseConfig(testenv.DatabaseT(t))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id text)`); err != nil {
		t.Fatal(err)
	}

	var recs []*kgo.Record
	rec := func(id, value string) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: []byte(id), Value: []byte(value), Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte(id)}}}
	}
	for i := range n {
		recs = append(recs, rec(fmt.Sprintf("pay-%03d", i), "ok"))
	}
	for i := range d {
		recs = append(recs, rec(fmt.Sprintf("pay-%03d", i), "ok")) // redelivered
	}
	recs = append(recs, rec("flaky", "flaky"))
	for i := range p {
		recs = append(recs, rec(fmt.Sprintf("poison-%d", i), "poison"))
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}

	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	flakyTries := 0
	r, err := dbscope.New(consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{topic}, Shards: 4,
		CommitInterval: 50 * time.Millisecond, Hooks: []hook.Hook{m}, Logger: slog.New(slog.DiscardHandler),
		Failures: retrytopic.Policy{InPlaceAttempts: 1, RetryableAttempts: 10, Backoff: time.Millisecond, MaxBackoff: time.Millisecond,
			Ladder: []time.Duration{100 * time.Millisecond}},
	}, dbscope.Options{Pool: pool, BatchSize: 8}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		<-gate
		switch string(r.Value) {
		case "poison":
			return consumer.DecodeError(errors.New("unparseable amount"))
		case "flaky":
			mu.Lock()
			flakyTries++
			n := flakyTries
			mu.Unlock()
			if n <= 2 {
				return consumer.Retryable(errors.New("gateway 503"))
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, consumer.Identity{}.Of(r))
		return err
	}))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(rctx) }()
	defer func() {
		once.Do(func() { close(gate) })
		cancel()
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}()

	g := m.Gatherer()
	lagOf := map[string]string{"consumer_group": group, "topic": topic}
	testenv.WaitFor(t, 20*time.Second, "the lag gauges to show the held backlog", func() bool {
		return value(t, g, "kscope_consumer_lag_records", lagOf) > 0 && value(t, g, "kscope_consumer_lag_seconds", lagOf) > 0 &&
			value(t, g, "kscope_in_flight_records", lagOf) > 0
	})
	once.Do(func() { close(gate) })

	outcome := func(o string) float64 {
		// Summed over the input and the retry topic, where the flaky
		// record's later deliveries happen.
		return value(t, g, "kscope_records_processed_total", map[string]string{"consumer_group": group, "outcome": o})
	}
	testenv.WaitFor(t, 30*time.Second, "every delivery counted", func() bool {
		return outcome("success") == n+1 && outcome("dead_lettered") == p
	})
	testenv.WaitFor(t, 20*time.Second, "the lag gauges at zero", func() bool {
		return value(t, g, "kscope_consumer_lag_records", lagOf) == 0 && value(t, g, "kscope_consumer_lag_seconds", lagOf) == 0 &&
			value(t, g, "kscope_in_flight_records", lagOf) == 0
	})
	for o, want := range map[string]float64{"success": n + 1, "duplicate": d, "retried": 2, "dead_lettered": p, "skipped": 0, "stale": 0, "gap": 0} {
		if got := outcome(o); got != want {
			t.Errorf("processed{outcome=%q} = %v, want %v", o, got, want)
		}
	}
	if got := value(t, g, "kscope_records_received_total", lagOf); got != n+d+1+p {
		t.Errorf("received on %s = %v, want %d", topic, got, n+d+1+p)
	}
	if got := value(t, g, "kscope_route_produces_total", map[string]string{"route": "retry", "result": "ok"}); got != 2 {
		t.Errorf("retry produces = %v, want 2", got)
	}
	if got := value(t, g, "kscope_route_produces_total", map[string]string{"route": "dlt", "result": "ok"}); got != p {
		t.Errorf("dlt produces = %v, want %d", got, p)
	}
	if got := value(t, g, "kscope_handling_duration_seconds", map[string]string{"consumer_group": group}); got != n+d+1+p+2 {
		t.Errorf("handling durations observed = %v, want one per counted delivery (%d)", got, n+d+1+p+2)
	}
	if value(t, g, "kscope_offset_commits_total", map[string]string{"topic": topic, "result": "ok"}) == 0 {
		t.Error("no successful offset commit counted for the topic")
	}
	if got := value(t, g, "kscope_duplicates_total", map[string]string{"consumer_group": group, "source": hook.DuplicateInbox}); got != d {
		t.Errorf("kscope_duplicates_total{source=inbox} = %v, want %d", got, d)
	}
	if got := value(t, g, "kscope_dead_letters_total", map[string]string{"consumer_group": group, "reason": hook.ReasonDeserializationFailure}); got != p {
		t.Errorf("kscope_dead_letters_total{reason=deserialization_failure} = %v, want %d", got, p)
	}
	if value(t, g, "kscope_rebalances_total", map[string]string{"kind": "assigned"}) == 0 {
		t.Error("no assignment counted")
	}
	// A hop that arrives after its due time is not held, so not observed.
	if v := value(t, g, "kscope_retry_lateness_seconds", nil); v < 1 || v > 2 {
		t.Errorf("retry lateness observations = %v, want 1 or 2", v)
	}

	// /metrics serves them, and no label carries a key or a payload.
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	if !strings.Contains(text, `kscope_records_processed_total{consumer_group="ledger",outcome="duplicate",topic="payments"} 7`) {
		t.Errorf("/metrics lacks the duplicate count:\n%s", text)
	}
	for _, secret := range []string{"pay-0", "poison-", "unparseable", "gateway 503"} {
		if strings.Contains(text, secret) {
			t.Errorf("/metrics shows %q, a key, payload or error text", secret)
		}
	}
}

// A partition that leaves the member takes its series with it.
func TestPartitionGoneDeletesItsSeries(t *testing.T) {
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m.OnLag(hook.Lag{Group: "g", Topic: "t", Partition: 3, Offsets: 5, InFlight: 2, Paused: true})
	if n := series(t, m.Gatherer(), "kscope_consumer_lag_records"); n != 1 {
		t.Fatalf("%d lag series, want 1", n)
	}
	m.OnPartitionGone("g", "t", 3)
	for _, name := range []string{"kscope_consumer_lag_records", "kscope_consumer_lag_seconds", "kscope_in_flight_records", "kscope_partition_paused"} {
		if n := series(t, m.Gatherer(), name); n != 0 {
			t.Errorf("%s keeps %d series after the partition left", name, n)
		}
	}
}

// A hold because the deployment is wrong is exported as the number of
// key-shards holding, per group and reason, back to 0 when it ends.
func TestHeldKeyShardsGauge(t *testing.T) {
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"consumer_group": "g", "reason": "deployment"}
	for _, n := range []int{1, 2, 1} {
		m.OnHold(hook.Hold{Group: "g", Reason: "deployment", Shards: n, Err: errors.New("relation does not exist")})
		if v := value(t, m.Gatherer(), "kscope_held_key_shards", labels); v != float64(n) {
			t.Fatalf("kscope_held_key_shards = %v, want %d", v, n)
		}
	}
	m.OnHold(hook.Hold{Group: "g", Reason: "deployment"})
	if v := value(t, m.Gatherer(), "kscope_held_key_shards", labels); v != 0 {
		t.Fatalf("kscope_held_key_shards = %v after the hold ended, want 0", v)
	}
}

// Registering twice into one registry is an error, not a panic.
func TestRegistersIntoTheUsersRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := kscopeprom.New(kscopeprom.Options{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := kscopeprom.New(kscopeprom.Options{Registerer: reg}); err == nil {
		t.Fatal("registering the metrics twice into one registry did not fail")
	}
}

// The Kafka scope reports through the same hooks: deliveries count once
// their transaction commits, and the lag gauges end at zero.
func TestKafkaScopeCounts(t *testing.T) {
	const n, p = 30, 4
	ctx := context.Background()
	k := testenv.KafkaT(t)
	for _, topic := range []string{"orders", "orders.out"} {
		if err := k.CreateTopic(ctx, topic, 2); err != nil {
			t.Fatal(err)
		}
	}
	var recs []*kgo.Record
	for i := range n + p {
		v := "ok"
		if i < p {
			v = "poison"
		}
		recs = append(recs, &kgo.Record{Topic: "orders", Key: []byte(fmt.Sprintf("o-%02d", i)), Value: []byte(v)})
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := txn.New(consumer.Config{
		Brokers: k.Brokers, Group: "enricher", Topics: []string{"orders"}, Shards: 4,
		Hooks: []hook.Hook{m}, Logger: slog.New(slog.DiscardHandler),
	}, txn.Options{TransactionalID: "enricher-prom"}, txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
		if string(r.Value) == "poison" {
			return consumer.DecodeError(errors.New("unparseable order"))
		}
		out.Emit(&kgo.Record{Topic: "orders.out", Key: r.Key, Value: r.Value})
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(rctx) }()
	g := m.Gatherer()
	of := map[string]string{"consumer_group": "enricher", "topic": "orders"}
	outcome := func(o string) float64 {
		return value(t, g, "kscope_records_processed_total", map[string]string{"consumer_group": "enricher", "outcome": o})
	}
	testenv.WaitFor(t, 20*time.Second, "every delivery counted", func() bool {
		return outcome("success") == n && outcome("dead_lettered") == p
	})
	testenv.WaitFor(t, 10*time.Second, "the lag at zero", func() bool {
		return series(t, g, "kscope_consumer_lag_records") > 0 && value(t, g, "kscope_consumer_lag_records", of) == 0
	})
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if got := value(t, g, "kscope_records_received_total", of); got != n+p {
		t.Errorf("received = %v, want %d", got, n+p)
	}
	if value(t, g, "kscope_offset_commits_total", map[string]string{"topic": "orders", "result": "ok"}) == 0 {
		t.Error("no committed transaction counted for the input topic")
	}
	if got := value(t, g, "kscope_dead_letters_total", map[string]string{"topic": "orders", "reason": hook.ReasonDeserializationFailure}); got != p {
		t.Errorf("kscope_dead_letters_total{reason=deserialization_failure} = %v, want %d", got, p)
	}
	if got := value(t, g, "kscope_route_produces_total", map[string]string{"route": "dlt", "class": "terminal", "result": "ok"}); got != p {
		t.Errorf("dlt produces = %v, want %d", got, p)
	}
}

// A handler that does not return shows as a stalled key-shard while it
// hangs, and no longer once it returned.
func TestStalledKeyShardGauge(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const topic, group = "prom-stall", "g-prom-stall"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	r, err := consumer.New(consumer.Config{Brokers: k.Brokers, Group: group, Topics: []string{topic}, CommitInterval: 50 * time.Millisecond,
		StallWarning: 200 * time.Millisecond, Hooks: []hook.Hook{m}, Logger: slog.New(slog.DiscardHandler)},
		consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
			<-release // ignores its context
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(runCtx) }()
	labels := map[string]string{"consumer_group": group, "topic": topic}
	testenv.WaitFor(t, time.Minute, "the stalled key-shard exported", func() bool { return value(t, m.Gatherer(), "kscope_stalled_key_shards", labels) == 1 })
	close(release)
	testenv.WaitFor(t, time.Minute, "the stall's end exported", func() bool { return value(t, m.Gatherer(), "kscope_stalled_key_shards", labels) == 0 })
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
