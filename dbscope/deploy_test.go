package dbscope_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// runUntilErrorOrApplied runs r until Run returns or r applies a record,
// and returns Run's error (nil when r applied a record first).
func runUntilErrorOrApplied(t *testing.T, r *dbscope.Runner) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var err error
	returned := false
	testenv.WaitFor(t, time.Minute, "Run to return or a record applied", func() bool {
		select {
		case err = <-errc:
			returned = true
			return true
		default:
			return r.Stats().DB.Applied > 0
		}
	})
	if !returned {
		cancel()
		<-errc
	}
	return err
}

// A group renamed between two deployments, with dbscope.Options.Consumer
// left to default to the group id: the new group has no committed offset
// and starts from the earliest, and its inbox namespace is empty, so
// every record still in the topic would be applied a second time (a
// double charge per payment). The runner refuses to start with a
// ConfigError on Consumer that names the earlier consumer; with Consumer
// set to that name it applies nothing again, and with Consumer set to its
// own name (another pipeline) it applies every record, as asked.
func TestRenamedGroupRefusedWhileConsumerDefaultsToIt(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, other = "payments", "refunds"
	for _, tp := range []string{topic, other} {
		if err := k.CreateTopic(ctx, tp, 2); err != nil {
			t.Fatal(err)
		}
	}
	total := k.ProduceKeyed(t, topic, 10, 3)
	first, err := dbscope.New(baseConfig(k, "pay-v1", topic), dbscope.Options{Pool: pool}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, first, k, "pay-v1", topic, "the first deployment", time.Minute, func() bool { return first.Stats().DB.Applied == int64(total) })

	renamed, err := dbscope.New(baseConfig(k, "pay-v2", topic), dbscope.Options{Pool: pool}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	err = runUntilErrorOrApplied(t, renamed)
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Consumer" || !strings.Contains(ce.Reason, `"pay-v1"`) {
		t.Fatalf("the renamed group's Run returned %v after applying %d records again (effects %+v); want a *consumer.ConfigError on Consumer naming \"pay-v1\"",
			err, renamed.Stats().DB.Applied, countEffects(t, pool))
	}
	t.Log(err)
	if c := countEffects(t, pool); c.rows != total {
		t.Fatalf("effects %+v after the refused start, want %d", c, total)
	}

	// Consumer set to the earlier name: every record is a duplicate.
	kept, err := dbscope.New(baseConfig(k, "pay-v2", topic), dbscope.Options{Pool: pool, Consumer: "pay-v1"}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, kept, k, "pay-v2", topic, "the renamed group", time.Minute, func() bool { return kept.Stats().Done == int64(total) })
	if st := kept.Stats().DB; st.Applied != 0 || st.Duplicates != int64(total) {
		t.Fatalf("with Consumer set to the earlier name: stats %+v, want every record a duplicate", st)
	}

	// Another pipeline, named explicitly, applies the records for itself.
	own, err := dbscope.New(baseConfig(k, "audit", topic), dbscope.Options{Pool: pool, Consumer: "audit"}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, own, k, "audit", topic, "another pipeline", time.Minute, func() bool { return own.Stats().DB.Applied == int64(total) })

	// A new pipeline on a topic no other consumer is known to have read
	// starts, with a warning that names the inbox's other consumers (a
	// group renamed after its earlier one was deleted looks the same).
	var logs testenv.LogBuffer
	n := k.ProduceKeyed(t, other, 2, 2)
	cfg := baseConfig(k, "refunds", other)
	cfg.Logger = logs.Logger()
	fresh, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, fresh, k, "refunds", other, "a new pipeline", time.Minute, func() bool { return fresh.Stats().DB.Applied == int64(n) })
	if !strings.Contains(logs.String(), "other_consumers") {
		t.Fatalf("a new pipeline beside other consumers of the inbox logged no warning naming them:\n%s", logs.String())
	}
}

// A deployment with ordered retries leaves A in a retry topic and B
// waiting behind it in kscope_waiting, its offset committed; the next
// deployment runs on tables of another prefix (Migrate run with it). On
// those tables B would never be applied: A comes back from the retry topic
// unknown to them and is applied, B stays in kscope_waiting. The runner
// refuses to start with a ConfigError on TablePrefix; back on the earlier
// prefix A and B are applied once, in order.
func TestTablePrefixChangedWhileRecordsWaitRefused(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "payments", "g-prefix"
	cfg, h, fail := parkBehindRetry(t, k, pool, group, topic, time.Second)
	fail.Store(false)

	if err := dbscope.Migrate(ctx, pool, "pay_"); err != nil {
		t.Fatal(err)
	}
	r2, err := dbscope.New(cfg, dbscope.Options{Pool: pool, TablePrefix: "pay_"}, h)
	if err != nil {
		t.Fatal(err)
	}
	err = runUntilErrorOrApplied(t, r2)
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) || ce.Field != "TablePrefix" || !strings.Contains(ce.Reason, `"kscope_"`) {
		parked, waiting, _ := parkingRows(t, pool)
		t.Fatalf("Run on the new prefix returned %v; effects %q, and kscope_ still holds %d parked and %d waiting rows no runner on it reads; "+
			"want a *consumer.ConfigError on TablePrefix naming \"kscope_\"", err, effectOrder(t, pool), parked, waiting)
	}
	t.Log(err)

	r3, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, h)
	if err != nil {
		t.Fatal(err)
	}
	run(t, r3)
	waitAppliedInOrder(t, pool, 30*time.Second, "k/0", "k/1")
}
