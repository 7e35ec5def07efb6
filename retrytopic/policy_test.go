package retrytopic_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	. "github.com/kscope-dev/kscope/retrytopic"
)

func TestPolicyBudgetsByClass(t *testing.T) {
	p := Policy{}.WithDefaults("g")
	steps := func(c Class) (retries int, last Step) {
		for attempt := 1; ; attempt++ {
			s := p.Next(c, attempt, attempt, -1, false)
			if s.Action != ActionRetry {
				return retries, s
			}
			if s.Delay <= 0 || s.Delay > p.MaxBackoff {
				t.Fatalf("%s attempt %d: delay %s", c, attempt, s.Delay)
			}
			retries++
		}
	}
	for c, want := range map[Class]struct {
		retries int
		action  Action
	}{
		ClassRetryable: {5, ActionDeadLetter}, // 6 attempts in all
		ClassUnknown:   {2, ActionDeadLetter}, // 3 attempts in all
		ClassTerminal:  {0, ActionDeadLetter},
		ClassSkip:      {0, ActionSkip},
	} {
		n, last := steps(c)
		if n != want.retries || last.Action != want.action {
			t.Errorf("%s: %d retries then %s, want %d then %s", c, n, last.Action, want.retries, want.action)
		}
	}
	// A forged huge attempt count from an earlier hop spends the budget.
	if s := p.Next(ClassRetryable, MaxAttempt, 1, -1, true); s.Action != ActionDeadLetter {
		t.Fatalf("attempt %d: %s", MaxAttempt, s.Action)
	}
	// Backoff grows from 1s towards the cap, with jitter in the upper half.
	if d := p.Next(ClassRetryable, 1, 1, -1, true).Delay; d < 500*time.Millisecond || d > time.Second {
		t.Fatalf("first delay %s, want within [0.5s, 1s]", d)
	}
}

func TestPolicyClassifyOverrides(t *testing.T) {
	declined := errors.New("card declined")
	p := Policy{Classify: func(err error) (Class, bool) {
		if errors.Is(err, declined) {
			return ClassSkip, true
		}
		return 0, false
	}}.WithDefaults("g")
	if c := p.ClassOf(declined); c != ClassSkip {
		t.Fatalf("classifier ignored: %s", c)
	}
	if c := p.ClassOf(Terminal(errors.New("bad json"))); c != ClassTerminal {
		t.Fatalf("fall-through to the mark: %s", c)
	}
	if c := p.ClassOf(errors.New("boom")); c != ClassUnknown {
		t.Fatalf("unmarked: %s", c)
	}
}

func TestPolicyValidate(t *testing.T) {
	for _, tc := range []struct {
		p    Policy
		says string
	}{
		{Policy{Backoff: -1}, "Failures.Backoff"},
		{Policy{Backoff: time.Minute, MaxBackoff: time.Second}, "Failures.MaxBackoff"},
		{Policy{RetryableAttempts: -2}, "Failures.RetryableAttempts"},
		{Policy{UnknownAttempts: 5000}, "Failures.UnknownAttempts"},
		{Policy{DeadLetterTopic: "no spaces allowed"}, "Failures.DeadLetterTopic"},
	} {
		err := tc.p.WithDefaults("g").Validate()
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%+v: %v, want an error naming %s", tc.p, err, tc.says)
		}
	}
	if err := (Policy{}).WithDefaults("team/payments").Validate(); err != nil {
		t.Fatalf("default policy: %v", err)
	}
}

// With retry topics, a record retries in place InPlaceAttempts times per
// hop, then climbs the ladder, staying on its last step, until its budget is
// spent.
func TestPolicyLadder(t *testing.T) {
	p := Policy{RetryableAttempts: 9}.WithDefaults("g")
	var got []string
	stage, attempt := -1, 0
	for {
		for inPlace := 1; ; inPlace++ {
			attempt++
			s := p.Next(ClassRetryable, attempt, inPlace, stage, true)
			got = append(got, s.Action.String())
			if s.Action == ActionRetryTopic {
				if s.Topic != RetryTopic("g", p.Ladder[s.Stage]) || s.Delay != p.Ladder[s.Stage] {
					t.Fatalf("step %+v", s)
				}
				stage = s.Stage
				break
			}
			if s.Action == ActionDeadLetter {
				want := "retry retry retry_topic retry retry retry_topic retry retry dead_letter"
				if strings.Join(got, " ") != want {
					t.Fatalf("steps %s, want %s", strings.Join(got, " "), want)
				}
				if stage != 1 {
					t.Fatalf("reached stage %d", stage)
				}
				return
			}
		}
	}
}

func TestLadderMustIncrease(t *testing.T) {
	err := Policy{Ladder: []time.Duration{time.Minute, 30 * time.Second}}.WithDefaults("g").Validate()
	if err == nil || !strings.Contains(err.Error(), "delays must increase, got 1m0s then 30s") {
		t.Fatalf("%v", err)
	}
}

// The default policy walks a retryable failure through every rung the
// documentation lists (in place, 5s, in place, 1m, in place, 10m, in place,
// DLT), and an unknown one through its in-place attempts to the DLT.
func TestDefaultPolicyReachesEveryRung(t *testing.T) {
	p := Policy{}.WithDefaults("g")
	if got := p.Ladder; len(got) != 3 || got[0] != 5*time.Second || got[1] != time.Minute || got[2] != 10*time.Minute {
		t.Fatalf("default ladder %v, want 5s, 1m, 10m", got)
	}
	walk := func(c Class) []string {
		var path []string
		stage, attempt := -1, 0
		for hop := 0; hop < 20; hop++ {
			for inPlace := 1; ; inPlace++ {
				attempt++
				s := p.Next(c, attempt, inPlace, stage, true)
				switch s.Action {
				case ActionRetry:
					path = append(path, "retry")
					continue
				case ActionRetryTopic:
					path = append(path, s.Topic)
					stage = s.Stage
				default:
					return append(path, s.Action.String())
				}
				break
			}
		}
		t.Fatalf("%s: no end after 20 hops: %v", c, path)
		return nil
	}
	want := "retry retry g.kscope-retry-5s retry retry g.kscope-retry-1m retry retry g.kscope-retry-10m retry retry dead_letter"
	if got := strings.Join(walk(ClassRetryable), " "); got != want {
		t.Errorf("retryable path:\n got %s\nwant %s", got, want)
	}
	if got := strings.Join(walk(ClassUnknown), " "); got != "retry retry dead_letter" {
		t.Errorf("unknown path: %s", got)
	}
	// Without retry topics the budget stays in place: 6 attempts.
	if b := p.RetryBudget(false); b != DefaultRetryableAttempts {
		t.Errorf("in-place budget %d, want %d", b, DefaultRetryableAttempts)
	}
}

// A record's waits in place start over at Backoff on every hop: the
// delayed retry topics are where a record waits long without holding its
// key-shard, so the attempts it made on earlier hops must not make it hold
// its key-shard for minutes when it comes back from one.
func TestInPlaceBackoffStartsOverOnEveryHop(t *testing.T) {
	p := Policy{}.WithDefaults("g")
	stage, attempt := -1, 0
	for hop := 0; hop <= len(p.Ladder); hop++ {
		for inPlace := 1; ; inPlace++ {
			attempt++
			s := p.Next(ClassRetryable, attempt, inPlace, stage, true)
			if s.Action != ActionRetry {
				stage = s.Stage
				break
			}
			// The inPlace-th wait of a hop: the step doubled inPlace-1
			// times, whatever the attempts before this hop.
			step := p.Backoff << (inPlace - 1)
			if s.Delay < step/2 || s.Delay > step {
				t.Fatalf("hop %d, attempt %d (%d on this hop): waits %s in place, want %s to %s", hop, attempt, inPlace, s.Delay, step/2, step)
			}
		}
	}
	if attempt != p.RetryBudget(true) {
		t.Fatalf("%d attempts, want the budget of %d", attempt, p.RetryBudget(true))
	}
}
