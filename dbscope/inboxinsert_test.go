package dbscope_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// A batch of new records writes its inbox rows with the plain insert. A
// batch that holds an id the inbox has already (a redelivery, a producer's
// retry), or the same id twice, fails that insert before any handler runs:
// its transaction is opened again with the checked insert, the duplicates
// are skipped and every new record is applied once, its handler called
// once.
func TestPlainInboxInsertFallsBackOnADuplicate(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "inbox-plain", "g-inbox-plain"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	produce := func(ids ...string) {
		t.Helper()
		for i, id := range ids {
			rec := &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("acct-%d", i%5)), Value: []byte(id),
				Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte(id)}}}
			if err := k.Produce(ctx, rec); err != nil {
				t.Fatal(err)
			}
		}
	}
	var calls atomic.Int64
	r, err := dbscope.New(baseConfig(k, group, topic), dbscope.Options{Pool: pool},
		dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			calls.Add(1)
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	defer stop() //nolint:errcheck // stopped below; a second stop is a no-op

	var first []string
	for i := range 40 {
		first = append(first, fmt.Sprintf("pay_%d", i))
	}
	produce(first...)
	testenv.WaitFor(t, time.Minute, "the new records applied", func() bool { return r.Stats().DB.Applied == 40 })
	plain, conflicts := dbscope.InboxInserts(r)
	if plain == 0 || conflicts != 0 {
		t.Fatalf("new records: %d batches took the plain insert, %d met a duplicate; want some, none", plain, conflicts)
	}

	// Five ids applied above, produced again among new ones, and one new
	// id produced twice in a row.
	second := []string{"pay_40", "pay_3", "pay_41", "pay_17", "pay_42", "pay_42", "pay_29", "pay_43", "pay_0", "pay_39", "pay_44"}
	produce(second...)
	testenv.WaitFor(t, time.Minute, "the second records done", func() bool { return r.Stats().Done == 51 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, conflicts := dbscope.InboxInserts(r); conflicts == 0 {
		t.Fatal("no plain insert met the ids already in the inbox")
	}
	st := r.Stats().DB
	if st.Applied != 45 || st.Duplicates != 6 || calls.Load() != 45 {
		t.Fatalf("stats %+v, handler calls %d: want 45 applied, 6 duplicates, 45 calls", st, calls.Load())
	}
	if c := countEffects(t, pool); c.rows != 45 || c.unique != 45 {
		t.Fatalf("effects %+v, want 45 rows for 45 ids", c)
	}
	var inbox int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kscope_inbox`).Scan(&inbox); err != nil {
		t.Fatal(err)
	}
	if inbox != 45 {
		t.Fatalf("%d inbox rows, want 45", inbox)
	}
}
