package policy

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
)

// Conflict is a field that both the code and the policy set, to different
// values: the code's value is used.
type Conflict struct {
	// Group is the consumer group.
	Group string
	// Field is the field in the code, such as "Failures.Ladder" (a
	// consumer.Config field) or "Versions.Gaps" (a scope's Options).
	Field string
	// Key is the field in the policy file, such as "failures.ladder".
	Key string
	// Code is the code's value, the one used.
	Code string
	// Policy is the policy's value, not used.
	Policy string
}

// String describes the conflict in one sentence.
func (c Conflict) String() string {
	return fmt.Sprintf("consumer group %s: the code sets %s to %s and the policy's %s says %s: the code's value is used; make them agree",
		c.Group, c.Field, c.Code, c.Key, c.Policy)
}

// failurePolicy returns the retrytopic.Policy the entry declares, without
// defaults.
func (c Consumer) failurePolicy() retrytopic.Policy {
	var p retrytopic.Policy
	if f := c.Failures; f != nil {
		p.Backoff, p.MaxBackoff = f.Backoff.Std(), f.MaxBackoff.Std()
		p.InPlaceAttempts, p.RetryableAttempts, p.UnknownAttempts = f.InPlaceAttempts, f.RetryableAttempts, f.UnknownAttempts
		if f.Ladder != nil {
			p.Ladder = make([]time.Duration, len(f.Ladder))
			for i, d := range f.Ladder {
				p.Ladder[i] = d.Std()
			}
		}
		p.DisableRetryTopics, p.Unordered = f.DisableRetryTopics, f.Unordered
	}
	if d := c.DeadLetter; d != nil {
		p.DeadLetterTopic, p.DeadLetterRetention = d.Topic, d.Retention.Std()
	}
	return p
}

// Apply returns cfg with the entry's owner in cfg.Owner (Owner.String,
// written on every dead letter) and its failure policy and dead-letter
// topic in cfg.Failures, for consumer.New, dbscope.New or txn.New. cfg stays the
// source of truth: each field of cfg.Failures that cfg sets (not left at
// its zero value) is kept, and where the policy says otherwise the
// disagreement is logged as a WARN on cfg.Logger (slog.Default() when
// nil) and returned as a Conflict. A field cfg leaves at zero takes the
// policy's value; one neither sets keeps the library's default. cfg.Group,
// when empty, becomes the entry's group. Apply fails for an entry that is
// not valid (an *Error), and for a cfg of another group.
func (c Consumer) Apply(cfg consumer.Config) (consumer.Config, []Conflict, error) {
	if err := c.Validate(); err != nil {
		return cfg, nil, err
	}
	if cfg.Group == "" {
		cfg.Group = c.Group
	} else if cfg.Group != c.Group {
		return cfg, nil, fmt.Errorf("policy: the entry of consumer group %q applied to a consumer.Config of group %q; apply the group's own entry (File.Consumer(cfg.Group))", c.Group, cfg.Group)
	}
	p, have := c.failurePolicy(), &cfg.Failures
	m := merger{group: c.Group}
	fill(&m, &cfg.Owner, c.Owner.String(), "Owner", "owner")
	fill(&m, &have.Backoff, p.Backoff, "Failures.Backoff", "failures.backoff")
	fill(&m, &have.MaxBackoff, p.MaxBackoff, "Failures.MaxBackoff", "failures.max_backoff")
	fill(&m, &have.InPlaceAttempts, p.InPlaceAttempts, "Failures.InPlaceAttempts", "failures.in_place_attempts")
	fill(&m, &have.RetryableAttempts, p.RetryableAttempts, "Failures.RetryableAttempts", "failures.retryable_attempts")
	fill(&m, &have.UnknownAttempts, p.UnknownAttempts, "Failures.UnknownAttempts", "failures.unknown_attempts")
	fill(&m, &have.DisableRetryTopics, p.DisableRetryTopics, "Failures.DisableRetryTopics", "failures.disable_retry_topics")
	fill(&m, &have.Unordered, p.Unordered, "Failures.Unordered", "failures.unordered")
	fill(&m, &have.DeadLetterTopic, p.DeadLetterTopic, "Failures.DeadLetterTopic", "dead_letter.topic")
	fill(&m, &have.DeadLetterRetention, p.DeadLetterRetention, "Failures.DeadLetterRetention", "dead_letter.retention")
	switch {
	case p.Ladder == nil:
	case have.Ladder == nil:
		have.Ladder = p.Ladder
	case !slices.Equal(have.Ladder, p.Ladder):
		m.conflict("Failures.Ladder", "failures.ladder", durations(have.Ladder), durations(p.Ladder))
	}
	m.log(cfg.Logger, c.file)
	return cfg, m.conflicts, nil
}

// ApplyGaps returns versions, a scope's Options.Versions (dbscope or txn),
// with the entry's gap policy: each field versions sets (not left at its
// zero value) is kept, a disagreement logged as a WARN on logger
// (slog.Default() when nil) and returned as a Conflict, and each field it
// leaves at zero takes the policy's value. The policy never turns version
// checks on: a record without a version would be poison. With versions nil
// and a gap policy declared, it returns nil and that Conflict. An entry
// without gaps returns versions as it is.
func (c Consumer) ApplyGaps(versions *sequence.Config, logger *slog.Logger) (*sequence.Config, []Conflict) {
	g := c.Gaps
	if g == nil {
		return versions, nil
	}
	m := merger{group: c.Group}
	if versions == nil {
		m.conflict("Versions", "gaps", "nil (no version checks)", "policy "+string(g.Policy))
		m.log(logger, c.file)
		return nil, m.conflicts
	}
	v := *versions
	fill(&m, &v.Gaps, g.sequenceGaps(), "Versions.Gaps", "gaps.policy")
	fill(&m, &v.GapTimeout, g.Timeout.Std(), "Versions.GapTimeout", "gaps.timeout")
	onTimeout := sequence.TimeoutDeadLetter
	if g.OnTimeout == TimeoutAccept {
		onTimeout = sequence.TimeoutAccept
	}
	fill(&m, &v.OnTimeout, onTimeout, "Versions.OnTimeout", "gaps.on_timeout")
	first := sequence.FirstAny
	if g.First == FirstMustBeOne {
		first = sequence.FirstMustBeOne
	}
	fill(&m, &v.First, first, "Versions.First", "gaps.first")
	fill(&m, &v.Header, g.Header, "Versions.Header", "gaps.header")
	m.log(logger, c.file)
	return &v, m.conflicts
}

// sequenceGaps returns the policy as a sequence.GapPolicy.
func (g *Gaps) sequenceGaps() sequence.GapPolicy {
	switch g.Policy {
	case GapDeadLetter:
		return sequence.DeadLetter
	case GapAccept:
		return sequence.Accept
	}
	return sequence.Wait
}

// merger collects the conflicts of one Apply.
type merger struct {
	group     string
	conflicts []Conflict
}

func (m *merger) conflict(field, key, code, policy string) {
	m.conflicts = append(m.conflicts, Conflict{Group: m.group, Field: field, Key: key, Code: code, Policy: policy})
}

// log warns of each conflict on l (slog.Default() when nil).
func (m *merger) log(l *slog.Logger, file string) {
	for _, c := range m.conflicts {
		logger(l).Warn("kscope: the code and the policy disagree; the code's value is used",
			"group", c.Group, "field", c.Field, "code", c.Code, "policy_field", c.Key, "policy", c.Policy, "policy_file", file)
	}
}

// fill sets *have to want when *have is zero and want is not; when both
// are set and differ, it keeps *have and records a conflict.
func fill[T comparable](m *merger, have *T, want T, field, key string) {
	var zero T
	switch {
	case want == zero || *have == want:
	case *have == zero:
		*have = want
	default:
		m.conflict(field, key, show(*have), show(want))
	}
}

// show writes a value as the file does.
func show(v any) string {
	switch v := v.(type) {
	case sequence.GapPolicy:
		return [...]string{"wait", "dead_letter", "accept"}[min(max(int(v), 0), 2)]
	case sequence.TimeoutPolicy:
		return map[bool]string{true: "accept", false: "dead_letter"}[v == sequence.TimeoutAccept]
	case sequence.FirstPolicy:
		return map[bool]string{true: "one", false: "any"}[v == sequence.FirstMustBeOne]
	case string:
		return fmt.Sprintf("%q", v)
	}
	return fmt.Sprint(v)
}

// durations writes a ladder as the file does: [5s, 1m0s].
func durations(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return "[" + strings.Join(s, ", ") + "]"
}
