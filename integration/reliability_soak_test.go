package integration

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// soakEnv overrides the soak's duration (a Go duration such as "30m").
const soakEnv = "KSCOPE_SOAK"

func soakDuration(t *testing.T) time.Duration {
	if v := os.Getenv(soakEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", soakEnv, v, err)
		}
		return d
	}
	if reliabilityLong() {
		return 3 * time.Minute
	}
	return 20 * time.Second
}

type soakSample struct {
	goroutines int
	heap       uint64 // live heap after a GC
}

func sampleRuntime() soakSample {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return soakSample{goroutines: runtime.NumGoroutine(), heap: ms.HeapAlloc}
}

// TestReliabilitySoak runs a DB-scope pipeline on a continuous stream for
// a bounded time (20s; 3m with KSCOPE_RELIABILITY=long; KSCOPE_SOAK sets
// it) and checks that the runner holds steady: after a warm-up quarter,
// the goroutine count and the live heap stay within a small tolerance of
// their first sample, and every record produced is applied exactly once.
func TestReliabilitySoak(t *testing.T) {
	d := soakDuration(t)
	start := time.Now()
	k := testenv.KafkaT(t)
	ctx := context.Background()
	pool, _ := dbEnv(t)
	const topic, group, keys = "soak", "g-soak", 20
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	r, err := dbscope.New(consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{topic}, Shards: 4,
		CommitInterval: 100 * time.Millisecond, Logger: relLogger(),
	}, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			key, seq, _ := testenv.ParseKeyed(r.Value)
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`, consumer.Identity{}.Of(r), key, seq)
			return err
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runRunner(t, r.Run)
	applied := func() int64 { return r.Stats().DB.Applied }

	// The producer keeps a bounded lead over the consumer until the end.
	end := start.Add(d)
	rounds := 0
	produce := func() {
		recs := make([]*kgo.Record, 0, keys)
		for i := range keys {
			key := fmt.Sprintf("k%03d", i)
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(fmt.Sprintf("%s/%d", key, rounds))})
		}
		if err := k.Produce(ctx, recs...); err != nil {
			t.Fatal(err)
		}
		rounds++
	}
	warm := start.Add(d / 4)
	var base, last, peak soakSample
	nextSample := warm
	// 400 records a second: a steady stream that keeps the in-process
	// broker's own memory (it holds every record) small next to the
	// tolerance, and leaves the machine's other work room.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) {
		<-tick.C
		if applied() >= int64((rounds-50)*keys) {
			produce()
		}
		if now := time.Now(); now.After(nextSample) {
			s := sampleRuntime()
			if base.goroutines == 0 {
				base = s
			}
			last = s
			peak.goroutines, peak.heap = max(peak.goroutines, s.goroutines), max(peak.heap, s.heap)
			nextSample = now.Add(d / 20)
		}
	}
	total := rounds * keys
	testenv.WaitFor(t, 2*time.Minute, "every record applied", func() bool { return applied() >= int64(total) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("%d records in %s; goroutines %d → %d (peak %d), live heap %.1f → %.1f MiB (peak %.1f)",
		total, d, base.goroutines, last.goroutines, peak.goroutines,
		float64(base.heap)/(1<<20), float64(last.heap)/(1<<20), float64(peak.heap)/(1<<20))
	if last.goroutines > base.goroutines+10 {
		t.Errorf("goroutines grew from %d to %d while the stream ran", base.goroutines, last.goroutines)
	}
	if limit := base.heap + base.heap/2 + 16<<20; last.heap > limit {
		t.Errorf("live heap grew from %d to %d bytes while the stream ran", base.heap, last.heap)
	}
	rows, unique := effectCount(t, pool)
	lost, dups := total-unique, rows-unique
	if lost != 0 || dups != 0 {
		t.Errorf("%d records: %d effects, %d unique", total, rows, unique)
	}
	addRelRow(relRow{Scope: "DB", Fault: fmt.Sprintf("soak: %s continuous stream, goroutines %d→%d, live heap %.0f→%.0f MiB",
		d, base.goroutines, last.goroutines, float64(base.heap)/(1<<20), float64(last.heap)/(1<<20)),
		Records: total, Lost: lost, Dups: dups, Duration: time.Since(start), Passed: !t.Failed()})
}
