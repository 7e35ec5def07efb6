// Package route is the routing table behind consumer.Router,
// dbscope.Router and txn.Router: which handler a record reaches, by its
// topic (or, on a retry topic, the topic it was first consumed from), a
// header value, a topic pattern, or the default. It is written once,
// generic in the scope's handler type H, and checked against a runner's
// topics at construction (Table.Check).
package route

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// ErrNoRoute is wrapped by the error a record with no route fails with.
var ErrNoRoute = errors.New("kscope: no route for the record")

// retryInfix is in the name of every retry topic (retrytopic.RetryTopic:
// "<group>.kscope-retry-<delay>").
const retryInfix = ".kscope-retry-"

// originalTopicHeader is retrytopic.HeaderOriginalTopic (this package sits
// below retrytopic's users and needs only the name).
const originalTopicHeader = "kscope-original-topic"

// Table maps records to handlers of type H. The zero value is an empty
// table; register routes with Topic, Header, Pattern and Default before the
// runner starts (a Table is not safe for registration while it is used).
type Table[H any] struct {
	topics   map[string]*topicRoutes[H]
	order    []string // topics in the order first registered
	patterns []patternRoute[H]
	def      H
	hasDef   bool
	errs     []error // registrations that cannot work, reported by Check
}

type topicRoutes[H any] struct {
	h       H
	has     bool
	headers []headerRoute[H]
}

type headerRoute[H any] struct {
	key, value string
	h          H
}

type patternRoute[H any] struct {
	expr string
	re   *regexp.Regexp
	h    H
}

func (t *Table[H]) bad(format string, args ...any) {
	t.errs = append(t.errs, fmt.Errorf(format, args...))
}

func (t *Table[H]) topic(name string) *topicRoutes[H] {
	if t.topics == nil {
		t.topics = make(map[string]*topicRoutes[H])
	}
	tr := t.topics[name]
	if tr == nil {
		tr = &topicRoutes[H]{}
		t.topics[name] = tr
		t.order = append(t.order, name)
	}
	return tr
}

// Topic routes the records of topic to h. isNil says whether h is nil (H
// is an interface type, which a type parameter cannot compare with nil).
func (t *Table[H]) Topic(topic string, h H, isNil bool) {
	switch {
	case strings.TrimSpace(topic) == "":
		t.bad("Topic: the topic name is empty; name the topic whose records the handler handles")
		return
	case isNil:
		t.bad("Topic(%q): the handler is nil; pass the handler for the topic's records", topic)
		return
	}
	tr := t.topic(topic)
	if tr.has {
		t.bad("Topic(%q): the topic is routed twice; route it once, or use Header to route by a header value", topic)
		return
	}
	tr.h, tr.has = h, true
}

// Header routes the records of topic whose header key has the value value
// (the last header of that name) to h, before the topic's own route.
func (t *Table[H]) Header(topic, key, value string, h H, isNil bool) {
	switch {
	case strings.TrimSpace(topic) == "":
		t.bad("Header: the topic name is empty; name the topic whose records carry header %q", key)
		return
	case key == "":
		t.bad("Header(%q): the header name is empty; name the header whose value routes the record (such as \"event-type\")", topic)
		return
	case isNil:
		t.bad("Header(%q, %q, %q): the handler is nil; pass the handler for these records", topic, key, value)
		return
	}
	tr := t.topic(topic)
	for _, hr := range tr.headers {
		if hr.key == key && hr.value == value {
			t.bad("Header(%q, %q, %q): routed twice; route each header value once", topic, key, value)
			return
		}
	}
	tr.headers = append(tr.headers, headerRoute[H]{key: key, value: value, h: h})
}

// Pattern routes the records of every topic the regular expression expr
// matches (Go syntax, matching anywhere in the name unless anchored) and
// no Topic or Header route names to h. Patterns are tried in the order
// registered.
func (t *Table[H]) Pattern(expr string, h H, isNil bool) {
	re, err := regexp.Compile(expr)
	switch {
	case err != nil:
		t.bad("Pattern(%q): not a regular expression (%v); fix its syntax", expr, err)
		return
	case isNil:
		t.bad("Pattern(%q): the handler is nil; pass the handler for the matching topics' records", expr)
		return
	}
	if slices.ContainsFunc(t.patterns, func(p patternRoute[H]) bool { return p.expr == expr }) {
		t.bad("Pattern(%q): routed twice; route each pattern once", expr)
		return
	}
	t.patterns = append(t.patterns, patternRoute[H]{expr: expr, re: re, h: h})
}

// Default routes every record no other route takes to h.
func (t *Table[H]) Default(h H, isNil bool) {
	switch {
	case isNil:
		t.bad("Default: the handler is nil; pass the handler for records no other route takes")
	case t.hasDef:
		t.bad("Default: set twice; set one default handler")
	default:
		t.def, t.hasDef = h, true
	}
}

// Headers reads a record's headers: the value of the last header named
// key, and whether there is one.
type Headers func(key string) ([]byte, bool)

// Lookup returns the handler for a record consumed from topic with the
// headers hdr. A record consumed from a retry topic is routed by the topic
// it was first consumed from (its original-topic header), so that its
// retries reach the handler of its first attempt. The order: the topic's
// header routes (in the order registered), the topic's route, the
// patterns (in order), the default. With none, the error wraps
// ErrNoRoute and names the topic and the header routes tried.
func (t *Table[H]) Lookup(topic string, hdr Headers) (H, error) {
	topic = RoutedTopic(topic, hdr)
	if tr := t.topics[topic]; tr != nil {
		for _, hr := range tr.headers {
			if v, ok := hdr(hr.key); ok && string(v) == hr.value {
				return hr.h, nil
			}
		}
		if tr.has {
			return tr.h, nil
		}
	}
	for _, p := range t.patterns {
		if p.re.MatchString(topic) {
			return p.h, nil
		}
	}
	if t.hasDef {
		return t.def, nil
	}
	var zero H
	return zero, t.noRoute(topic, hdr)
}

// RoutedTopic is the topic a record is routed by: its own, or, on a retry
// topic, the original-topic header's.
func RoutedTopic(topic string, hdr Headers) string {
	if strings.Contains(topic, retryInfix) {
		if v, ok := hdr(originalTopicHeader); ok && len(v) > 0 {
			return string(v)
		}
	}
	return topic
}

// noRoute is the error of a record of topic that no route takes.
func (t *Table[H]) noRoute(topic string, hdr Headers) error {
	tr := t.topics[topic]
	if tr == nil || len(tr.headers) == 0 {
		return fmt.Errorf("%w: topic %q has no route and the router has no default; add a route for it (Topic, Pattern) or a Default", ErrNoRoute, topic)
	}
	var seen []string
	for _, hr := range tr.headers {
		v, ok := hdr(hr.key)
		desc := hr.key + " absent"
		if ok {
			desc = fmt.Sprintf("%s=%q", hr.key, v)
		}
		if !slices.Contains(seen, desc) {
			seen = append(seen, desc)
		}
	}
	return fmt.Errorf("%w: topic %q has header routes only, none for this record (%s), and the router has no default; add a Header route for the value, a Topic route for the topic, or a Default",
		ErrNoRoute, topic, strings.Join(seen, ", "))
}
