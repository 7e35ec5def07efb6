package dbscope_test

import (
	"context"
	"testing"
	"time"

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
	if st := r.Stats(); st.DB.GapsAccepted != 2 || st.DB.VersionsSkipped != 3 || st.DB.GapsTimedOut != 0 || st.Failures.DeadLettered != 0 {
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
