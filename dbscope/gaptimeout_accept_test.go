package dbscope_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
)

// Wait, then accept (sequence.TimeoutAccept): a gap that does not fill
// within GapTimeout is applied over instead of dead-lettered; the
// versions it skipped are counted, and one that arrives later is stale.
// A record stored behind it that has waited as long (6, past the missing
// 5) is applied over its own gap when it is released.
func TestVersionGapWaitThenAccept(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "acct-events", "g-gap-accept"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	r, err := dbscope.New(versionConfig(k, group, topic), dbscope.Options{Pool: pool,
		Versions: &sequence.Config{GapTimeout: 500 * time.Millisecond, OnTimeout: sequence.TimeoutAccept}}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, versioned(topic, "K", 1, 0), versioned(topic, "K", 4, 0), versioned(topic, "K", 6, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "4 applied over the gap, then 6 over its own", func() bool { return appliedVersions(t, pool)["K"] == "1,4,6" })
	// The counters follow the commit that made the rows visible: wait for
	// the last transaction's to be added, then check them all.
	st := r.Stats()
	testenv.WaitFor(t, 10*time.Second, "the three records and both gaps counted", func() bool {
		st = r.Stats()
		return st.DB.Applied >= 3 && st.DB.GapsAccepted+st.DB.GapsTimedOut >= 2 && st.DB.VersionsSkipped >= 3 || st.Failures.DeadLettered > 0
	})
	if st.DB.GapsAccepted != 2 || st.DB.VersionsSkipped != 3 || st.DB.GapsTimedOut != 0 || st.Failures.DeadLettered != 0 {
		t.Errorf("stats %+v, dead letters %d; want two gaps accepted over 3 versions, nothing dead-lettered", st.DB, st.Failures.DeadLettered)
	}
	if n := len(k.ReadAll(t, retrytopic.DLTopic(group))); n != 0 {
		t.Errorf("the DLT holds %d records; want none", n)
	}
	// 2 and 5 arrive after their key moved past them: stale.
	if err := k.Produce(ctx, versioned(topic, "K", 2, 0), versioned(topic, "K", 5, 0)); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, versioned(topic, "K", 7, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "7 applied, 2 stale", func() bool {
		return appliedVersions(t, pool)["K"] == "1,4,6,7" && r.Stats().DB.Stale == 2
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// Options.FillGap rebuilds a key's missing state in the record's
// transaction: the record past the gap is applied at once, after the
// state the fill wrote, and the gap counts as filled; a fill that fails
// fails the record (retried, then filled), and nothing of the failed
// attempt is kept.
func TestVersionGapFilled(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "acct-events", "g-gap-fill"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var fails atomic.Int32
	fails.Store(1)
	fill := func(ctx context.Context, tx pgx.Tx, r *consumer.Record, gap sequence.Result) error {
		for v := gap.Expected(); v < gap.Version; v++ {
			if _, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`, fmt.Sprintf("fill-%d", v), string(r.Key), v); err != nil {
				return err
			}
		}
		if fails.Add(-1) >= 0 {
			return errors.New("source of truth: 503") // after its writes: they roll back
		}
		return nil
	}
	r, err := dbscope.New(versionConfig(k, group, topic), dbscope.Options{Pool: pool, Versions: &sequence.Config{}, FillGap: fill}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, versioned(topic, "K", 1, 0), versioned(topic, "K", 4, 0), versioned(topic, "K", 5, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "2 and 3 filled, then 4 and 5 applied", func() bool { return appliedVersions(t, pool)["K"] == "1,2,3,4,5" })
	testenv.WaitFor(t, 10*time.Second, "the three records counted", func() bool { return r.Stats().DB.Applied >= 3 })
	if st := r.Stats().DB; st.GapsFilled != 1 || st.GapsTimedOut != 0 || st.Failed != 1 {
		t.Errorf("stats %+v; want one gap filled, after one failed attempt", st)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	_, err = dbscope.New(versionConfig(k, group, topic), dbscope.Options{Pool: pool, FillGap: fill}, dbscope.HandlerFunc(insertEffect))
	if err == nil || !strings.Contains(err.Error(), "FillGap") {
		t.Errorf("FillGap without Versions: %v; want an error naming FillGap", err)
	}
}
