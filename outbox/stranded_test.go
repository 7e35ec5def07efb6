package outbox_test

import (
	"context"
	"fmt"
	"hash/fnv"
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

// A Writer with fewer partitions than the relay writes rows the relay
// publishes, but some keys' rows to a partition their key does not hash to
// under the relay's Partitions: a key whose rows sit in two partitions is
// published side by side, out of order. The relay counts those rows in
// Stats().Misplaced, once each, and logs an ERROR.
func TestRowsOfAWriterWithFewerPartitionsAreReported(t *testing.T) {
	k, pool, _ := setup(t)
	writeStream(t, pool, outbox.Writer{Partitions: 2}, "", 40, 40)
	var logs testenv.LogBuffer
	r, stop := runRelay(t, outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 4, Logger: logs.Logger(), PollInterval: 20 * time.Millisecond})
	testenv.WaitFor(t, time.Minute, "every row published", func() bool { return r.Stats().Published == 40 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var misplaced int64
	for i := range 40 {
		key := fmt.Sprintf("k%02d", i)
		if outboxPartition(key, 2) != outboxPartition(key, 4) {
			misplaced++
		}
	}
	if misplaced == 0 {
		t.Fatal("no key changes partition between 2 and 4 partitions: the test proves nothing")
	}
	if got := r.Stats().Misplaced; got != misplaced {
		t.Fatalf("Stats().Misplaced = %d; want %d, the rows whose key hashes to another of the relay's 4 partitions", got, misplaced)
	}
	if r.Stats().Stranded != 0 {
		t.Fatalf("Stats().Stranded = %d: a Writer with fewer partitions strands nothing", r.Stats().Stranded)
	}
	if !strings.Contains(logs.String(), "hashes to another partition") {
		t.Fatalf("no ERROR about the misplaced rows:\n%s", logs.String())
	}
}

// outboxPartition is the Writer's partition of key among n (FNV-1a).
func outboxPartition(key string, n uint32) uint32 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return h.Sum32() % n
}
