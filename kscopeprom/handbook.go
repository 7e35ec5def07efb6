package kscopeprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kscope-dev/kscope/hook"
)

// newHandbookMetrics creates the counters of dead letters by reason,
// duplicates by source and event-type overflows.
func (m *Metrics) newHandbookMetrics() {
	gt := []string{"consumer_group", "topic"}
	m.dead = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_dead_letters_total",
		Help: "Records the dead-letter topic acknowledged, by reason: terminal_failure, deserialization_failure, schema_incompatible, retries_exhausted, expired, no_route."},
		append(gt, "reason"))
	m.dups = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_duplicates_total",
		Help: "Records not handled again because they repeat one already applied, by what found them: inbox, dedupe_store, kafka_guard."},
		append(gt, "source"))
	m.overflow = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_event_type_overflow_total",
		Help: "Deliveries counted with event_type=\"other\": their event type came after Options.EventTypeLimit others, or cannot be a label value."},
		gt)
}

// processedByType counts e in kscope_records_processed_total with its
// event_type label.
func (m *Metrics) processedByType(e hook.RecordEnd) {
	et, over := m.events.of(e.Record)
	if over {
		m.overflow.WithLabelValues(e.Group, e.Record.Topic).Inc()
	}
	m.processed.WithLabelValues(e.Group, e.Record.Topic, string(e.Outcome), et).Inc()
}

// deadReason is the reason label of a dead letter: the route's, or, from a
// scope that did not say, terminal_failure for a terminal failure and
// retries_exhausted for any other.
func deadReason(r hook.Route) string {
	switch {
	case r.Reason != "":
		return r.Reason
	case r.Class == "terminal":
		return hook.ReasonTerminalFailure
	}
	return hook.ReasonRetriesExhausted
}

// orUnknown is detail, or "unknown" when it is empty.
func orUnknown(detail string) string {
	if detail == "" {
		return "unknown"
	}
	return detail
}
