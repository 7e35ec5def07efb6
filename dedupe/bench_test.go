package dedupe_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/dedupe"
)

// benchBatches runs what the runner does per batch of 64 records: one
// Seen of their identities, then one Remember of them.
func benchBatches(b *testing.B, s dedupe.Store) {
	ctx := context.Background()
	ids := make([]string, 64)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		for i := range ids {
			ids[i] = fmt.Sprintf("orders/%d/%d", n%12, n)
			n++
		}
		if _, err := s.Seen(ctx, ids); err != nil {
			b.Fatal(err)
		}
		if err := s.Remember(ctx, ids, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(n), "µs/record")
}

func BenchmarkMemoryBatchOf64(b *testing.B) { benchBatches(b, dedupe.NewMemory(0)) }

func BenchmarkPostgresBatchOf64(b *testing.B) {
	pool := newPGPool(b)
	s, err := dedupe.NewPostgres(pool, dedupe.PostgresOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	benchBatches(b, s)
}
