package route

import (
	"fmt"
	"regexp"
	"slices"
)

// Check returns what stops the table from routing the records of a runner
// that consumes topics and the topics the regular expressions patterns
// match, one sentence per problem, each saying what to change: a
// registration that cannot work (an empty name, a nil handler, a bad
// expression, a route given twice), a topic no route takes (with no
// default), a pattern the table has no route of the same expression for
// (with no default), and a Topic or Header route for a topic the runner
// does not consume, whose handler would never run. what names the router
// in the sentences ("consumer.Router", say).
func (t *Table[H]) Check(what string, topics, patterns []string) []Problem {
	var out []Problem
	for _, err := range t.errs {
		out = append(out, Problem{Reason: err.Error()})
	}
	for _, topic := range topics {
		if !t.covers(topic) {
			out = append(out, Problem{"Topics", fmt.Sprintf("lists %q, which the handler (a %s) has no route for, and the router has no default; add a route for it (Topic(%q, handler) or a Pattern that matches it), or a Default", topic, what, topic)})
		}
	}
	var res []*regexp.Regexp
	for _, p := range patterns {
		if re, err := regexp.Compile(p); err == nil {
			res = append(res, re)
		}
		if t.hasDef || slices.ContainsFunc(t.patterns, func(r patternRoute[H]) bool { return r.expr == p }) {
			continue
		}
		out = append(out, Problem{"TopicPatterns", fmt.Sprintf("has %q, which the handler (a %s) has no Pattern route of the same expression for, and the router has no default; add Pattern(%q, handler), or a Default", p, what, p)})
	}
	for _, topic := range t.order {
		if slices.Contains(topics, topic) || slices.ContainsFunc(res, func(re *regexp.Regexp) bool { return re.MatchString(topic) }) {
			continue
		}
		out = append(out, Problem{Reason: fmt.Sprintf("routes topic %q, which Config.Topics does not list and no Config.TopicPatterns matches, so its handler would never run; add the topic to Config.Topics, or remove the route", topic)})
	}
	return out
}

// Problem is one problem Check found: Field is the consumer.Config field
// at fault ("Topics", "TopicPatterns"), or "" for the router's own.
type Problem struct {
	Field, Reason string
}

// covers reports whether a route or the default takes some records of
// topic.
func (t *Table[H]) covers(topic string) bool {
	if t.hasDef {
		return true
	}
	if tr := t.topics[topic]; tr != nil && (tr.has || len(tr.headers) > 0) {
		return true
	}
	return slices.ContainsFunc(t.patterns, func(p patternRoute[H]) bool { return p.re.MatchString(topic) })
}
