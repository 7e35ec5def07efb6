package outbox

import "time"

// Rate limits of the ERROR lines a lasting state repeats.

// errorLogEvery is how often an ERROR that a state goes on is repeated.
const errorLogEvery = 30 * time.Second

// throttle lets a log line through at most once an interval and counts
// the ones it held back meanwhile.
type throttle struct {
	last time.Time
	held int
}

// allow reports whether a line may be logged now, and how many were held
// back since the last one.
func (t *throttle) allow() (held int, ok bool) {
	now := time.Now()
	if !t.last.IsZero() && now.Sub(t.last) < errorLogEvery {
		t.held++
		return 0, false
	}
	held, t.held, t.last = t.held, 0, now
	return held, true
}
