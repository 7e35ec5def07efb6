// Package backoff computes retry delays: exponential, capped, with jitter.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Delay returns the wait before retry attempt+1 (attempt counts from 1):
// base doubled per attempt, capped at limit, with jitter over the upper half
// so that workers failing together do not retry together.
func Delay(attempt int, base, limit time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	half := d / 2
	return half + rand.N(half+1)
}

// Sleep waits for d or for ctx to be done, and reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	return SleepOr(ctx, d, nil)
}

// SleepOr is Sleep that also ends when stop is closed (a nil stop never
// is): a worker's backoff ends at its partition's revoke.
func SleepOr(ctx context.Context, d time.Duration, stop <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
}
