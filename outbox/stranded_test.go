package outbox_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/outbox"
)

// A Writer whose Partitions is not the relay's (changed in one service
// and not in the relay, say) writes some rows to partitions no relay of
// the outbox publishes: they sat in the table, unpublished, with nothing
// saying so. The relay counts them in Stats().Stranded and logs an ERROR
// naming the partitions and what to do; the rows of its own partitions
// are published as ever.
func TestRowsOutsideTheRelaysPartitionsAreReported(t *testing.T) {
	k, pool, _ := setup(t)
	ctx := context.Background()
	writeStream(t, pool, outbox.Writer{Partitions: 8}, "", 40, 40)
	var outside, inside int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE partition >= 4), count(*) FILTER (WHERE partition < 4) FROM kscope_outbox`).Scan(&outside, &inside); err != nil {
		t.Fatal(err)
	}
	if outside == 0 || inside == 0 {
		t.Fatalf("%d rows in partitions 4-7 and %d in 0-3: the keys should fall on both sides", outside, inside)
	}
	var logs testenv.LogBuffer
	r, stop := runRelay(t, outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 4, Logger: logs.Logger(), PollInterval: 20 * time.Millisecond})
	testenv.WaitFor(t, time.Minute, "the rows outside the relay's partitions counted", func() bool { return r.Stats().Stranded == outside })
	testenv.WaitFor(t, time.Minute, "the rows of the relay's partitions published", func() bool { return r.Stats().Published == inside })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var line string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "level=ERROR") && strings.Contains(l, "no relay of it publishes") {
			line = l
		}
	}
	for _, want := range []string{"rows=" + itoa(outside), "relay_partitions=4", "Writer.Partitions must be the relay's"} {
		if !strings.Contains(line, want) {
			t.Fatalf("the relay's ERROR %q does not say %q", line, want)
		}
	}
	if n := len(k.ReadAll(t, "payments.booked")); int64(n) != inside {
		t.Fatalf("%d records published; want the %d of the relay's partitions", n, inside)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
