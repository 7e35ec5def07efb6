package consumer

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The per-key limiters kept are bounded: past RateLimit.Keys, the least
// recently used key's is dropped, and a key used again keeps its own.
func TestRateKeysBounded(t *testing.T) {
	l := newLimits(RateLimit{PerKey: Rate{PerSecond: 1}, Keys: 16})
	hot := l.keys.get("t", []byte("hot"))
	for i := range 100 {
		l.keys.get("t", fmt.Appendf(nil, "k%d", i))
		if got := l.keys.get("t", []byte("hot")); got != hot {
			t.Fatalf("the key used between the others lost its limiter after %d others", i+1)
		}
	}
	if n := l.keys.size(); n != 16 {
		t.Fatalf("%d keys kept; want 16", n)
	}
}

// A wait ends when the record's context ends: its reservation is given
// back, and the call fails with the context's error (the record is left
// undone, for its next delivery).
func TestRateWaitEndsWithContext(t *testing.T) {
	l := newLimits(RateLimit{Records: Rate{PerSecond: 0.5}})
	rec := &Record{Record: &kgo.Record{}}
	if err := l.take(context.Background(), []*Record{rec}); err != nil {
		t.Fatal(err) // the bucket's one token
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := l.take(ctx, []*Record{rec})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("take = %v; want the context's error", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the wait went on %s past its context's end", d)
	}
	if s := l.stats(); s.Waits != 1 {
		t.Fatalf("stats %+v; want one wait", s)
	}
}

// A batch takes a token per record, in turns of the burst.
func TestRateBatchTakesATokenPerRecord(t *testing.T) {
	l := newLimits(RateLimit{Records: Rate{PerSecond: 100, Burst: 2}})
	batch := make([]*Record, 10)
	for i := range batch {
		batch[i] = &Record{Record: &kgo.Record{}}
	}
	start := time.Now()
	if err := l.take(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	// 2 at once, 8 more at 100 a second.
	if d := time.Since(start); d < 70*time.Millisecond {
		t.Fatalf("a batch of 10 at 100 a second, burst 2, went after %s; want about 80ms", d)
	}
}
