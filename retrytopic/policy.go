package retrytopic

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kscope-dev/kscope/internal/backoff"
)

// Defaults applied by Policy to fields left at their zero value.
const (
	DefaultBackoff    = time.Second
	DefaultMaxBackoff = 5 * time.Minute
	// DefaultRetryableAttempts is the retryable budget of a record that
	// cannot use the retry topics (they are disabled, or the scope keeps
	// the record's retries in place). A record that can use them gets one
	// pass through every rung instead: see Policy.RetryableAttempts.
	DefaultRetryableAttempts = 6
	DefaultUnknownAttempts   = 3
	DefaultInPlaceAttempts   = 3
)

// Policy says what happens to a record whose handler failed. The zero value
// is the default policy.
//
// Classification, in this order: Classify (when set and it returns ok);
// then the error's own mark: [Skip] (a business rejection: acknowledged,
// counted, logged), [Terminal] or [DecodeError] (dead-lettered at once),
// [Retryable] (the full budget); anything else is unknown (the smaller
// budget). A retried record waits with exponential backoff and jitter,
// inside its key-shard's worker, so later records of its key wait behind it
// and other keys go on. Once its budget is spent it goes to the dead-letter
// topic with its failure metadata.
type Policy struct {
	// Backoff is the backoff step before the second attempt in place; it
	// doubles per attempt up to MaxBackoff, and starts over at Backoff on
	// each hop (a record back from a retry topic). Each wait is drawn
	// between half the step and the whole step (equal jitter): with the
	// defaults, 1s and 5m, the first wait is 0.5 to 1s.
	Backoff    time.Duration
	MaxBackoff time.Duration

	// RetryableAttempts is how many attempts a retryable failure gets in
	// all before the DLT; attempts made on earlier hops count. Default:
	// enough to pass through every rung of the Ladder once —
	// InPlaceAttempts × (rungs + 1), 12 with the default ladder (3 in
	// place, 5s, 3 in place, 1m, 3 in place, 10m, 3 in place, DLT) — for a
	// record that may use the retry topics, and DefaultRetryableAttempts
	// (6, in place) for one that may not.
	RetryableAttempts int

	// UnknownAttempts is how many attempts an unclassified error gets in
	// all before the DLT. Default 3: with the default InPlaceAttempts an
	// unknown error is retried in place only and never reaches a retry
	// topic. Mark a transient failure [Retryable] to send it through the
	// ladder, or raise this budget.
	UnknownAttempts int

	// InPlaceAttempts is how many attempts a record gets inside its
	// key-shard's worker, on each hop, before it moves to the next retry
	// topic. Default 3.
	InPlaceAttempts int

	// Ladder is the delay of each retry topic, in order; a record that
	// fails on the last one goes to it again until its budget is spent.
	// Default DefaultLadder (5s, 1m, 10m). Topics are named by RetryTopic.
	Ladder []time.Duration

	// DisableRetryTopics keeps every retry in place: a failing record holds
	// its key-shard until it succeeds or its budget is spent.
	DisableRetryTopics bool

	// Unordered lets later records of a key overtake one that is in the
	// retry topics. By default they wait behind it (the DB scope parks them
	// in PostgreSQL; the AtLeastOnce scope, which has no store, keeps keyed
	// records' retries in place, so order holds across restarts too, and
	// uses the retry topics only when Unordered is set).
	Unordered bool

	// Classify, when not nil, classifies an error before its own mark is
	// looked at; it returns ok=false to leave the error to the default
	// classification.
	Classify func(err error) (c Class, ok bool)

	// DeadLetterTopic is the dead-letter topic. Default DLTopic(group): one
	// per consumer group. It is created if missing, with as many partitions
	// as the largest source topic, unless DoNotCreateTopics is set. A
	// runner refuses one it consumes (one of its topics, or a name of the
	// group's retry topics): its records would be handled and
	// dead-lettered again without end.
	DeadLetterTopic   string
	DoNotCreateTopics bool

	// DeadLetterRetention is the retention the dead-letter topic is created
	// with. Default 0: unlimited (retention.ms=-1), so that a dead letter
	// nobody has looked at yet never expires; a positive duration sets it.
	// The retry topics are created with a retention of at least 7 days and
	// four times their delay, so a record waiting in one never expires
	// first. Topics that exist already keep their settings (a runner logs
	// a warning when the dead-letter topic's retention is limited).
	// Java (Spring Kafka): the DLT's retention.ms.
	DeadLetterRetention time.Duration

	// SpringHeaders adds Spring Kafka's kafka_dlt-* headers to dead-letter
	// records, so tools built for Spring read kscope's DLT.
	SpringHeaders bool

	group string
}

// RetryTopics returns the retry topics of the ladder, in order (none when
// retry topics are disabled).
func (p Policy) RetryTopics() []string {
	if p.DisableRetryTopics {
		return nil
	}
	out := make([]string, len(p.Ladder))
	for i, d := range p.Ladder {
		out[i] = RetryTopic(p.group, d)
	}
	return out
}

// WithDefaults returns p with zero fields set for consumer group group.
func (p Policy) WithDefaults(group string) Policy {
	if p.Backoff == 0 {
		p.Backoff = DefaultBackoff
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = DefaultMaxBackoff
	}
	if p.UnknownAttempts == 0 {
		p.UnknownAttempts = DefaultUnknownAttempts
	}
	if p.DeadLetterTopic == "" {
		p.DeadLetterTopic = DLTopic(group)
	}
	if p.InPlaceAttempts == 0 {
		p.InPlaceAttempts = DefaultInPlaceAttempts
	}
	if p.Ladder == nil {
		p.Ladder = DefaultLadder
	}
	if p.group == "" {
		p.group = group
	}
	return p
}

// Problem is one thing wrong with a Policy.
type Problem struct {
	Field  string // the Policy field at fault
	Reason string // what is wrong and what to change
}

// Validate reports the contradictions of a policy that has its defaults,
// each saying what to change.
func (p Policy) Validate() error {
	var errs []error
	for _, pr := range p.Problems() {
		errs = append(errs, fmt.Errorf("kscope: Config.Failures.%s: %s", pr.Field, pr.Reason))
	}
	return errors.Join(errs...)
}

// Problems lists what Validate reports, one entry per field.
func (p Policy) Problems() []Problem {
	var out []Problem
	bad := func(field, format string, args ...any) {
		out = append(out, Problem{field, fmt.Sprintf(format, args...)})
	}
	if p.Backoff < 0 {
		bad("Backoff", "is %s; set a positive duration (0 selects %s)", p.Backoff, DefaultBackoff)
	}
	if p.MaxBackoff < 0 || (p.MaxBackoff > 0 && p.MaxBackoff < p.Backoff) {
		bad("MaxBackoff", "is %s, below Backoff (%s); raise it or lower Backoff", p.MaxBackoff, p.Backoff)
	}
	if p.RetryableAttempts < 0 || p.RetryableAttempts > MaxAttempt {
		bad("RetryableAttempts", "is %d; set it between 1 and %d (0 selects one pass through every rung of the ladder)", p.RetryableAttempts, MaxAttempt)
	}
	if p.UnknownAttempts < 0 || p.UnknownAttempts > MaxAttempt {
		bad("UnknownAttempts", "is %d; set it between 1 and %d (0 selects %d)", p.UnknownAttempts, MaxAttempt, DefaultUnknownAttempts)
	}
	if p.DeadLetterRetention < 0 {
		bad("DeadLetterRetention", "is %s; set a positive duration, or 0 for unlimited retention", p.DeadLetterRetention)
	}
	if p.InPlaceAttempts < 0 {
		bad("InPlaceAttempts", "is %d; set it to 1 or more (0 selects %d)", p.InPlaceAttempts, DefaultInPlaceAttempts)
	}
	for i, d := range p.Ladder {
		switch {
		case d <= 0:
			bad("Ladder", "delay %d is %s; every delay must be positive", i, d)
		case d%time.Millisecond != 0:
			bad("Ladder", "delay %d is %s; use whole milliseconds (the delay names its retry topic, and due times travel in milliseconds)", i, d)
		case i > 0 && d <= p.Ladder[i-1]:
			bad("Ladder", "delays must increase, got %s then %s", p.Ladder[i-1], d)
		}
	}
	if len(p.Ladder) > maxStage+1 {
		bad("Ladder", "has %d delays; at most %d (a record's stage header counts to %d)", len(p.Ladder), maxStage+1, maxStage)
	}
	if !validTopic(p.DeadLetterTopic) {
		bad("DeadLetterTopic", "%q is not a valid topic name; use at most 249 of a-z A-Z 0-9 . _ -", p.DeadLetterTopic)
	}
	return out
}

func validTopic(t string) bool {
	if t == "" || len(t) > 249 || t == "." || t == ".." {
		return false
	}
	return topicSafe(t) == t
}

// ClassOf classifies err under the policy.
func (p Policy) ClassOf(err error) Class {
	if p.Classify != nil {
		if c, ok := p.Classify(err); ok {
			return c
		}
	}
	return ClassOf(err)
}

// TopicConfigs returns the topic configuration the policy creates topic
// with: unlimited (or DeadLetterRetention) retention for the dead-letter
// topic, and a retention of at least 7 days and four times the delay for a
// retry topic of the ladder. Other topics get none.
func (p Policy) TopicConfigs(topic string) map[string]*string {
	ms := func(d time.Duration) map[string]*string {
		v := strconv.FormatInt(d.Milliseconds(), 10)
		if d < 0 {
			v = "-1"
		}
		return map[string]*string{"retention.ms": &v}
	}
	if topic == p.DeadLetterTopic {
		if p.DeadLetterRetention > 0 {
			return ms(p.DeadLetterRetention)
		}
		return ms(-1)
	}
	for _, d := range p.Ladder {
		if RetryTopic(p.group, d) == topic {
			return ms(max(7*24*time.Hour, 4*d))
		}
	}
	return nil
}

// RetryBudget returns the attempts a retryable failure gets in all:
// RetryableAttempts when set, else its default for a record that may use
// the retry topics (topics) or may not.
func (p Policy) RetryBudget(topics bool) int {
	switch {
	case p.RetryableAttempts > 0:
		return p.RetryableAttempts
	case topics && !p.DisableRetryTopics && len(p.Ladder) > 0:
		return min(max(p.InPlaceAttempts, 1)*(len(p.Ladder)+1), MaxAttempt)
	}
	return DefaultRetryableAttempts
}

// Action is what to do with a record after a failed attempt.
type Action int

const (
	// ActionRetry runs the record again after Step.Delay.
	ActionRetry Action = iota
	// ActionSkip acknowledges the record without further work.
	ActionSkip
	// ActionDeadLetter sends the record to the dead-letter topic.
	ActionDeadLetter
	// ActionRetryTopic sends the record to retry topic Step.Stage, to run
	// again after that topic's delay.
	ActionRetryTopic
	// ActionHold holds the record's key (consumer.Config.KeyBreaker, the
	// circuit breaker of each key): the record, and every later record of
	// its key, waits until the key's probe, Step.Delay from now. The
	// policy (Next) never returns it; the runner's key breaker does.
	ActionHold
)

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case ActionRetry:
		return "retry"
	case ActionSkip:
		return "skip"
	case ActionDeadLetter:
		return "dead_letter"
	case ActionRetryTopic:
		return "retry_topic"
	case ActionHold:
		return "hold"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Step is the policy's decision after a failed attempt.
type Step struct {
	Action Action
	Class  Class
	Delay  time.Duration // for ActionRetry: the in-place wait; for ActionRetryTopic: the topic's delay; for ActionHold: the time until the key's probe
	Stage  int           // for ActionRetryTopic: the ladder step
	Topic  string        // for ActionRetryTopic: the retry topic
}

// Next decides what follows a failure of class c on attempt (1 for the
// first attempt, counting earlier hops), the inPlace-th attempt on this hop.
// stage is the ladder step the record came from (-1 from a source topic);
// topics says whether the caller may use the retry topics for this record.
func (p Policy) Next(c Class, attempt, inPlace, stage int, topics bool) Step {
	budget := p.UnknownAttempts
	topics = topics && !p.DisableRetryTopics && len(p.Ladder) > 0
	switch c {
	case ClassSkip:
		return Step{Action: ActionSkip, Class: c}
	case ClassTerminal:
		return Step{Action: ActionDeadLetter, Class: c}
	case ClassRetryable:
		budget = p.RetryBudget(topics)
	}
	if attempt >= budget {
		return Step{Action: ActionDeadLetter, Class: c}
	}
	if topics && inPlace >= p.InPlaceAttempts {
		next := min(stage+1, len(p.Ladder)-1)
		return Step{Action: ActionRetryTopic, Class: c, Delay: p.Ladder[next], Stage: next, Topic: RetryTopic(p.group, p.Ladder[next])}
	}
	// The wait grows with the attempts of this hop only: a record back
	// from a retry topic starts again at Backoff, as the long waits are
	// the retry topics', which hold nothing, and a wait in place holds
	// its whole key-shard.
	return Step{Action: ActionRetry, Class: c, Delay: backoff.Delay(inPlace, p.Backoff, p.MaxBackoff)}
}
