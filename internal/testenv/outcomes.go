package testenv

import (
	"context"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
)

// Outcomes is a hook (hook.RecordHook and hook.RecordEventHook) that
// records, by record value, how each delivery ended and the events
// reported for it.
type Outcomes struct {
	mu     sync.Mutex
	ends   map[string][]hook.RecordEnd
	events map[string][]hook.Event
}

// NewOutcomes returns an empty Outcomes.
func NewOutcomes() *Outcomes {
	return &Outcomes{ends: map[string][]hook.RecordEnd{}, events: map[string][]hook.Event{}}
}

// OnRecordStart implements hook.RecordHook.
func (o *Outcomes) OnRecordStart(ctx context.Context, _ hook.RecordStart) context.Context {
	return ctx
}

// OnRecordEnd implements hook.RecordHook.
func (o *Outcomes) OnRecordEnd(_ context.Context, e hook.RecordEnd) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ends[string(e.Record.Value)] = append(o.ends[string(e.Record.Value)], e)
}

// OnRecordEvent implements hook.RecordEventHook.
func (o *Outcomes) OnRecordEvent(_ context.Context, _ string, r *kgo.Record, ev hook.Event, _ string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events[string(r.Value)] = append(o.events[string(r.Value)], ev)
}

// Last returns the last delivery end of the record whose value is value.
func (o *Outcomes) Last(value string) (hook.RecordEnd, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	es := o.ends[value]
	if len(es) == 0 {
		return hook.RecordEnd{}, false
	}
	return es[len(es)-1], true
}

// Outcome returns the outcome of the last delivery of the record whose
// value is value ("" when none ended).
func (o *Outcomes) Outcome(value string) hook.Outcome {
	e, _ := o.Last(value)
	return e.Outcome
}

// Events returns the events reported for the record whose value is
// value.
func (o *Outcomes) Events(value string) []hook.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]hook.Event(nil), o.events[value]...)
}
