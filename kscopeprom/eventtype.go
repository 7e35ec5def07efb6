package kscopeprom

import (
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultEventTypeLimit is how many event types kscope_records_processed_total
// labels by their own name when Options.EventTypeLimit is 0.
const DefaultEventTypeLimit = 50

// The event_type label's values that name no event type of a record.
const (
	// EventTypeNone labels the records without the Options.EventTypeHeader
	// header (or with it empty).
	EventTypeNone = "none"
	// EventTypeOther labels the records whose event type came after
	// Options.EventTypeLimit others, or is not valid UTF-8 or longer than
	// maxEventType bytes; each is counted in
	// kscope_event_type_overflow_total too.
	EventTypeOther = "other"
)

// maxEventType is the longest event type kept as a label value.
const maxEventType = 128

// eventTypes keeps the event types seen, up to a limit: the values of the
// event_type label.
type eventTypes struct {
	header string
	limit  int

	mu   sync.RWMutex
	seen map[string]string // the header's value → the label value (the same string, kept once)
}

// newEventTypes checks o's event-type options and returns their state; nil
// when Options.EventTypeHeader is empty.
func newEventTypes(o Options) (*eventTypes, error) {
	switch {
	case o.EventTypeLimit < 0:
		return nil, fmt.Errorf("kscopeprom: Options.EventTypeLimit is %d; set a positive number of event types to label by name, or 0 for the default of %d", o.EventTypeLimit, DefaultEventTypeLimit)
	case o.EventTypeHeader == "" && o.EventTypeLimit != 0:
		return nil, fmt.Errorf("kscopeprom: Options.EventTypeLimit is set but Options.EventTypeHeader is empty; set EventTypeHeader to the header that names a record's event type, or remove EventTypeLimit")
	case o.EventTypeHeader == "":
		return nil, nil
	}
	limit := o.EventTypeLimit
	if limit == 0 {
		limit = DefaultEventTypeLimit
	}
	return &eventTypes{header: o.EventTypeHeader, limit: limit, seen: map[string]string{}}, nil
}

// of returns r's event_type label value, and whether it overflowed (it is
// EventTypeOther because the limit was reached, or its value cannot be a
// label).
func (e *eventTypes) of(r *kgo.Record) (string, bool) {
	var v []byte
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == e.header {
			v = r.Headers[i].Value
			break
		}
	}
	if len(v) == 0 {
		return EventTypeNone, false
	}
	e.mu.RLock()
	label, ok := e.seen[string(v)]
	e.mu.RUnlock()
	if ok {
		return label, false
	}
	if len(v) > maxEventType || !utf8.Valid(v) {
		return EventTypeOther, true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if label, ok := e.seen[string(v)]; ok {
		return label, false
	}
	if len(e.seen) >= e.limit {
		return EventTypeOther, true
	}
	label = string(v)
	e.seen[label] = label
	return label, false
}
