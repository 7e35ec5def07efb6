package retrytopic_test

import (
	"testing"
	"time"

	. "github.com/kscope-dev/kscope/retrytopic"
)

// Whatever a Policy holds, Validate never panics; a policy it accepts
// decides every failure without panicking, with a non-negative delay,
// within the attempt budget of its class, on a valid retry topic.
func FuzzPolicy(f *testing.F) {
	f.Add(int64(0), int64(0), 0, 0, 0, int64(0), int64(0), false, false, "", "g")
	f.Add(int64(-1), int64(-1), -1, -1, -1, int64(-5), int64(0), false, false, "bad topic", "g")
	f.Add(int64(time.Second), int64(time.Millisecond), 2000, 1, 0, int64(time.Minute), int64(time.Second), true, true, "x.dlt", "")
	f.Add(int64(1), int64(1<<62), 1000, 1000, 1<<30, int64(1), int64(2), false, true, "..", "payments")
	f.Fuzz(func(t *testing.T, backoff, maxBackoff int64, retryable, unknown, inPlace int, l1, l2 int64, disable, unordered bool, dlt, group string) {
		p := Policy{
			Backoff: time.Duration(backoff), MaxBackoff: time.Duration(maxBackoff),
			RetryableAttempts: retryable, UnknownAttempts: unknown, InPlaceAttempts: inPlace,
			DisableRetryTopics: disable, Unordered: unordered, DeadLetterTopic: dlt,
		}
		if l1 != 0 || l2 != 0 {
			p.Ladder = []time.Duration{time.Duration(l1), time.Duration(l2)}
		}
		p = p.WithDefaults(group)
		if err := p.Validate(); err != nil {
			if len(p.Problems()) == 0 {
				t.Fatalf("Validate failed with no Problems: %v", err)
			}
			return
		}
		for _, c := range []Class{ClassRetryable, ClassUnknown, ClassTerminal, ClassSkip} {
			for _, attempt := range []int{1, 2, p.RetryableAttempts, MaxAttempt} {
				for _, stage := range []int{-1, 0, 1, 64} {
					s := p.Next(c, attempt, 1, stage, true)
					if s.Delay < 0 {
						t.Fatalf("negative delay %s for %s attempt %d", s.Delay, c, attempt)
					}
					if attempt >= MaxAttempt && s.Action != ActionDeadLetter && s.Action != ActionSkip {
						t.Fatalf("attempt %d of %s was not dead-lettered: %s", attempt, c, s.Action)
					}
					if s.Action == ActionRetryTopic && (s.Topic == "" || s.Stage < 0 || s.Stage >= len(p.Ladder)) {
						t.Fatalf("retry step %+v outside the ladder %v", s, p.Ladder)
					}
				}
			}
		}
	})
}
