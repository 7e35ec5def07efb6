package policy

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/kscope-dev/kscope/retrytopic"
)

// Validate reports every problem of f (the checks Load and Parse run once
// the file decodes), as an *Error, or nil. The failure policy is checked
// by retrytopic.Policy's own checks, with the library's defaults for the
// fields f leaves out.
func (f *File) Validate() error {
	ps := &problems{file: f.path, index: f.index}
	if f.Version != FormatVersion {
		ps.add(-1, "", "version", "is %d; this kscope reads version %d: write version: %d", f.Version, FormatVersion, FormatVersion)
	}
	if len(f.Consumers) == 0 {
		ps.add(-1, "", "consumers", "lists no consumer group; add one entry per consumer group, starting with - group: <consumer group>")
	}
	first := map[string]int{}
	for i, c := range f.Consumers {
		if j, dup := first[c.Group]; dup && c.Group != "" {
			also := fmt.Sprintf("entry %d", j)
			if l := ps.index.line(j, "group"); l > 0 {
				also += fmt.Sprintf(", line %d", l)
			}
			ps.add(i, c.Group, "group", "is listed twice (also %s); keep one entry per consumer group", also)
			continue
		}
		first[c.Group] = i
		c.check(ps, i)
	}
	return ps.err()
}

// Validate reports the problems of an entry built in code, as an *Error,
// or nil.
func (c Consumer) Validate() error {
	ps := &problems{file: c.file}
	c.check(ps, 0)
	return ps.err()
}

// check records the problems of c, entry i.
func (c Consumer) check(ps *problems, i int) {
	bad := func(path, format string, args ...any) { ps.add(i, c.Group, path, format, args...) }
	if strings.TrimSpace(c.Group) == "" {
		bad("group", "is empty; set it to the consumer group id, as consumer.Config.Group names it")
	}
	if !slices.Contains(scopes, string(c.Scope)) {
		bad("scope", "%q is not a scope; use %s", c.Scope, strings.Join(scopes, ", "))
	}
	if strings.TrimSpace(c.Owner.Team) == "" {
		bad("owner.team", "is empty; name the team that owns the consumer and answers for its dead letters")
	}
	if strings.TrimSpace(c.Owner.Contact) == "" {
		bad("owner.contact", "is empty; say how to reach the owning team: a channel, an address or a rotation")
	}
	c.checkDedupe(bad)
	if n := len(c.Owner.String()); n > retrytopic.MaxOwnerLength {
		bad("owner", "takes %d bytes as \"team <contact>\" (the kscope-owner header of every dead letter); keep team and contact to %d bytes together", n, retrytopic.MaxOwnerLength-3)
	} else if strings.ContainsFunc(c.Owner.String(), func(r rune) bool { return r < ' ' || r == 0x7f }) {
		bad("owner", "holds a control character (a line break, a tab); write team and contact on one line each")
	}
	c.checkFailures(bad)
	if l := c.LagObjective; l != nil && l.P95Seconds <= 0 {
		bad("lag_objective.p95_seconds", "is %d; set the seconds (1 or more) the consumer's lag stays under 95%% of the time, or remove lag_objective for the default, %d", l.P95Seconds, int(DefaultLagObjective.Seconds()))
	}
	c.checkGaps(bad)
}

// checkFailures records the problems of the failure policy and the
// dead-letter topic, found by retrytopic.Policy's checks.
func (c Consumer) checkFailures(bad func(path, format string, args ...any)) {
	if f := c.Failures; f != nil && f.Ladder != nil && len(f.Ladder) == 0 {
		bad("failures.ladder", "is empty; remove it for the default ladder (%s), or set disable_retry_topics: true to keep every retry in place", durations(retrytopic.DefaultLadder))
	}
	p := c.failurePolicy().WithDefaults(c.Group)
	for _, pr := range p.Problems() {
		if pr.Field == "DeadLetterTopic" && (c.DeadLetter == nil || c.DeadLetter.Topic == "") {
			continue // the default, named after the group: a bad group is reported as such
		}
		bad(fieldPaths[pr.Field], "%s", goNamesRE.ReplaceAllStringFunc(pr.Reason, func(s string) string { return fieldKeys[s] }))
	}
	if _, ok := retrytopic.RetryTopicDelay(c.Group, p.DeadLetterTopic); ok && c.DeadLetter != nil && c.DeadLetter.Topic != "" {
		bad("dead_letter.topic", "%q is named as one of group %s's retry topics, which its runner consumes: dead letters would be handled again without end; name it otherwise (default %s)", p.DeadLetterTopic, c.Group, retrytopic.DLTopic(c.Group))
	}
}

// checkDedupe records the problems of the dedupe store.
func (c Consumer) checkDedupe(bad func(path, format string, args ...any)) {
	switch {
	case c.Dedupe == "":
	case !slices.Contains(dedupeStores, string(c.Dedupe)):
		bad("dedupe", "%q is not a dedupe store; use %s", c.Dedupe, strings.Join(dedupeStores, ", "))
	case c.Scope != ScopeAtLeastOnce && slices.Contains(scopes, string(c.Scope)):
		bad("dedupe", "the %s scope dedupes by itself (%s); remove dedupe, which says what store an at_least_once consumer runs with", c.Scope,
			map[Scope]string{ScopeDB: "its inbox", ScopeKafka: "its changelog and transactions"}[c.Scope])
	}
}

// checkGaps records the problems of the gap policy.
func (c Consumer) checkGaps(bad func(path, format string, args ...any)) {
	g := c.Gaps
	if g == nil {
		return
	}
	if c.Scope == ScopeAtLeastOnce {
		bad("gaps", "the at_least_once scope checks no versions; remove gaps, or declare the scope the consumer runs in (db or kafka: their Options.Versions)")
	}
	if !slices.Contains(gapPolicies, string(g.Policy)) {
		bad("gaps.policy", "%q is not a gap policy; use %s", g.Policy, strings.Join(gapPolicies, ", "))
	}
	switch {
	case g.Timeout < 0:
		bad("gaps.timeout", "is %s; set a positive duration, or remove it for the default (10m)", g.Timeout)
	case g.Timeout > 0 && g.Policy != GapWait && g.Policy != "":
		bad("gaps.timeout", "bounds a wait, and the policy is %s; remove timeout, or set policy: wait", g.Policy)
	}
	switch {
	case g.OnTimeout != "" && !slices.Contains(timeoutPolicies, string(g.OnTimeout)):
		bad("gaps.on_timeout", "%q is not a timeout policy; use %s (dead_letter by default)", g.OnTimeout, strings.Join(timeoutPolicies, " or "))
	case g.OnTimeout != "" && g.Policy != GapWait && g.Policy != "":
		bad("gaps.on_timeout", "says what becomes of a record that waited, and the policy is %s; remove on_timeout, or set policy: wait", g.Policy)
	}
	if g.First != "" && !slices.Contains(firstVersions, string(g.First)) {
		bad("gaps.first", "%q is not a first-version policy; use %s (any by default)", g.First, strings.Join(firstVersions, " or "))
	}
}

// fieldPaths and fieldKeys name retrytopic.Policy's fields in the file.
var (
	fieldPaths = map[string]string{
		"Backoff": "failures.backoff", "MaxBackoff": "failures.max_backoff",
		"InPlaceAttempts": "failures.in_place_attempts", "RetryableAttempts": "failures.retryable_attempts",
		"UnknownAttempts": "failures.unknown_attempts", "Ladder": "failures.ladder",
		"DeadLetterTopic": "dead_letter.topic", "DeadLetterRetention": "dead_letter.retention",
	}
	fieldKeys = map[string]string{}
	goNamesRE = regexp.MustCompile(`\b(MaxBackoff|Backoff|InPlaceAttempts|RetryableAttempts|UnknownAttempts|Ladder|DeadLetterTopic|DeadLetterRetention)\b`)
)

func init() {
	for name, path := range fieldPaths {
		_, key, _ := strings.Cut(path, ".")
		fieldKeys[name] = key
	}
}
