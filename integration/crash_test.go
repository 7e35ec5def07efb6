package integration

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kscope-dev/kscope/internal/testenv"
)

// A child consumer killed with SIGKILL at random moments mid-stream, then
// restarted, loses nothing: every record is handled at least once, per-key
// order holds (a redelivery replays from the last commit, it never skips),
// and the final committed offsets cover the whole topic.
func TestAtLeastOnceSurvivesKill9(t *testing.T) {
	k := testenv.KafkaT(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	ctx := context.Background()
	const topic, group, keys, perKey, kills = "crash-alo", "g-crash-alo", 25, 200, 6
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, topic, keys, perKey)

	obs := testenv.NewObserver()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for i := 0; i < kills; i++ {
		c := startChild(t, k, "at-least-once", group, topic, 200*time.Microsecond, obs.Record)
		target := obs.Handled() + int64(100+rng.IntN(400))
		testenv.WaitFor(t, time.Minute, "the child to make progress", func() bool {
			return obs.Handled() >= target || obs.Unique() == total
		})
		c.kill()
		t.Logf("kill %d: %d handled, %d unique of %d", i+1, obs.Handled(), obs.Unique(), total)
	}
	c := startChild(t, k, "at-least-once", group, topic, 0, obs.Record)
	testenv.WaitFor(t, 2*time.Minute, "every record handled", func() bool { return obs.Unique() == total })
	testenv.WaitFor(t, time.Minute, "offsets committed to the end", func() bool { return k.CommittedAll(t, group, topic) })
	if err := c.terminate(t); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	obs.CheckOrderWithReplays(t, keys, perKey)
	t.Logf("%d records, %d handlings (%d redelivered after kills)", total, obs.Handled(), obs.Handled()-int64(total))
}
