package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// The whole loop with a DB-scope pipeline: a record that fails as poison
// goes to the DLT; after the fix, a redrive to the source applies it once;
// a redrive of the now applied record is a no-op (its identity dedupes); a
// dry run changes nothing.
func TestRedriveAfterFixAppliesOnce(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool, err := pgxpool.New(ctx, testenv.DatabaseT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (entry text)`); err != nil {
		t.Fatal(err)
	}
	const topic, group = "captures", "ledger"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx,
		&kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("good")},
		&kgo.Record{Topic: topic, Key: []byte("b"), Value: []byte("needs-fix")}); err != nil {
		t.Fatal(err)
	}
	var fixed atomic.Bool
	r, err := dbscope.New(consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{topic},
		CommitInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	}, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		if string(r.Value) == "needs-fix" && !fixed.Load() {
			return consumer.Terminal(errors.New("unknown currency"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, string(r.Value))
		return err
	}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}()
	testenv.WaitFor(t, time.Minute, "the poison record dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 1 })
	ledger := func() []string {
		var out []string
		rows, _ := pool.Query(ctx, `SELECT entry FROM ledger ORDER BY entry`)
		for rows.Next() {
			var e string
			rows.Scan(&e)
			out = append(out, e)
		}
		rows.Close()
		return out
	}
	ends := func() int64 {
		e, err := k.EndOffsets(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		return e[0]
	}

	before := ends()
	if res := kscope(t, "dlt", "redrive", "--brokers", k.Brokers[0], "--group", group, "--to", "source", "--dry-run"); res.code != 0 {
		t.Fatalf("dry run: %+v", res)
	}
	if ends() != before {
		t.Fatal("a dry run produced records")
	}

	fixed.Store(true)
	if res := kscope(t, "dlt", "redrive", "--brokers", k.Brokers[0], "--group", group, "--to", "source", "--by", "oncall"); res.code != 0 {
		t.Fatalf("redrive: %+v", res)
	}
	testenv.WaitFor(t, time.Minute, "the redriven record applied", func() bool { return len(ledger()) == 2 })
	redriven := k.ReadAll(t, topic)[2]
	if !strings.Contains(testenv.Header(redriven, retrytopic.HeaderRedrive), "by=oncall") {
		t.Fatalf("no audit header on the redriven record: %v", redriven.Headers)
	}

	dups := r.Stats().DB.Duplicates
	if res := kscope(t, "dlt", "redrive", "--brokers", k.Brokers[0], "--group", group, "--to", "source"); res.code != 0 {
		t.Fatalf("second redrive: %+v", res)
	}
	testenv.WaitFor(t, time.Minute, "the second redrive seen as a duplicate", func() bool { return r.Stats().DB.Duplicates == dups+1 })
	if got := strings.Join(ledger(), ","); got != "good,needs-fix" {
		t.Fatalf("ledger %s: the redrive of an applied record was applied again", got)
	}
}
