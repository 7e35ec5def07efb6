// Package kscopeprom exports a kscope runner's metrics to Prometheus. Put a
// *Metrics in consumer.Config.Hooks:
//
//	m, err := kscopeprom.New(kscopeprom.Options{})
//	cfg.Hooks = append(cfg.Hooks, m)
//	http.Handle("/metrics", m.Handler())
//
// Every metric is prefixed kscope_ and labeled with consumer_group and
// topic; the per-partition ones (lag, in flight, paused) with partition
// too. No label carries a key, an offset or a payload, so cardinality is
// bounded by the topics and partitions a service consumes.
//
//	kscope_records_received_total            records polled
//	kscope_records_processed_total{outcome}  deliveries by outcome: success, duplicate,
//	                                         retried, parked, dead_lettered, skipped,
//	                                         stale, gap, filtered (consumer.Config.Keep),
//	                                         expired (consumer.Config.MaxAge, skipped),
//	                                         held (its key's circuit breaker holds it: it
//	                                         is delivered again at the key's probe);
//	                                         with Options.EventTypeHeader, also
//	                                         event_type (bounded: see below)
//	kscope_handler_retries_total{reason}     failed attempts retried in place, by reason:
//	                                         the failure's class (retryable, unknown), or
//	                                         timeout (consumer.ErrHandlerTimeout); a failure
//	                                         that waits for an open circuit breaker is not
//	                                         a retry. Summed over reason, the count it
//	                                         always was
//	kscope_dead_letters_total{reason}        records the dead-letter topic acknowledged, by
//	                                         reason (hook.Route.Reason): terminal_failure,
//	                                         deserialization_failure, schema_incompatible
//	                                         (a schema id the registry does not have, a
//	                                         schema the reader's cannot read),
//	                                         retries_exhausted, expired (consumer.Config.MaxAge),
//	                                         no_route (consumer.ErrNoRoute)
//	kscope_duplicates_total{source}          records not handled again because they repeat
//	                                         one already applied, by what found them: inbox
//	                                         (the DB scope), dedupe_store (consumer.Config.Dedupe),
//	                                         kafka_guard (txn.Options.Dedupe; counted when
//	                                         found, so a transaction that aborts and is
//	                                         replayed counts it again)
//	kscope_event_type_overflow_total         deliveries counted with event_type="other"
//	kscope_decode_failures_total{format}     records dead-lettered because their payload could
//	                                         not be decoded (format: json, avro, protobuf, or
//	                                         "payload" when the handler did not say)
//	kscope_handler_overruns_total            handler calls still running past
//	                                         consumer.Config.HandlerTimeout and HandlerGrace
//	                                         (they ignore their context; the runner's WARN
//	                                         names the record)
//	kscope_handling_duration_seconds         from the start of a delivery to its durable outcome
//	kscope_in_flight_records                 records polled and not finished, per partition
//	kscope_consumer_lag_records              high watermark minus the lowest unfinished offset
//	kscope_consumer_lag_seconds              age of the oldest unfinished record (on a retry
//	                                         topic, from its due time)
//	kscope_partition_paused                  1 while fetching a partition is paused
//	kscope_paused{target,reason}             while a pause (consumer.Runner.Pause,
//	                                         consumer.PauseFrom) is in force: when it
//	                                         began, in Unix seconds (target: "all", a
//	                                         topic, or topic[partition])
//	kscope_breaker_state{breaker}            a circuit breaker's state (consumer.Config.Breakers):
//	                                         0 closed, 1 half-open, 2 open
//	kscope_breaker_transitions_total{breaker,state}
//	                                         a circuit breaker's changes of state, by the
//	                                         state entered
//	kscope_dedupe_unavailable_total          records the AtLeastOnce scope handled while its
//	                                         dedupe store did not answer (consumer.FailOpen)
//	kscope_version_gaps_total{event}         version gaps found (event="found": a record ahead of
//	                                         its key's next version) and healed (event="healed":
//	                                         the missing versions came)
//	kscope_held_keys                         keys their circuit breakers hold in memory
//	                                         (consumer.Config.KeyBreaker; the DB scope's
//	                                         wait in PostgreSQL)
//	kscope_key_holds_total                   times a key's circuit breaker held it (its
//	                                         failures, or a failed probe)
//	kscope_offset_commits_total{result}      offset commit requests (in the Kafka scope,
//	                                         transactions), ok or error, per topic whose
//	                                         offsets they carried: a request of two topics
//	                                         counts once in each
//	kscope_route_produces_total{route,class,result}
//	                                         retry (route="retry") and dead-letter (route="dlt")
//	                                         produces, by failure class (retryable, unknown,
//	                                         terminal, which includes decode errors; parked),
//	                                         ok or error (kscope_dead_letters_total says why)
//	kscope_retry_lateness_seconds            how late held retry records were released
//	kscope_rebalances_total{kind}            assigned, revoked, lost
//	kscope_stalled_key_shards                key-shards that have finished none of their
//	                                         records for consumer.Config.StallWarning: a
//	                                         handler that does not return (the runner's
//	                                         WARN names the record)
//	kscope_held_key_shards{reason}           key-shards holding their records because the
//	                                         deployment is wrong (reason="deployment": a
//	                                         missing table or column, a refused privilege);
//	                                         nothing is routed for them while above 0
//
// With [Options.EventTypeHeader] (the header that names a record's event
// type), kscope_records_processed_total has an event_type label: the first
// [Options.EventTypeLimit] event types seen (default 50) by name, a record
// without the header [EventTypeNone], and any later event type
// [EventTypeOther], counted in kscope_event_type_overflow_total too, so
// that a producer that puts ids in the header cannot grow the series
// without bound.
//
// [Metrics.WatchRelay] adds an outbox relay's metrics (kscope_outbox_*).
// [Metrics.WatchDeadLetters] adds kscope_dead_letters_waiting{consumer_group,topic},
// the dead letters of a group waiting for triage (past what kscope dlt
// redrive committed).
// [Metrics.WatchShare] adds a share-group runner's counters
// (kscope_share_*_total, kscope_share_in_flight_records, read from its
// Stats), and [Metrics.WatchShareGroup] a share group's backlog per
// partition, kscope_share_backlog_records{consumer_group,topic,partition}.
//
// A delivery that did not finish (outcome aborted: a revoked partition, an
// aborted transaction) is not counted in records_processed: the record is
// delivered again and counted then.
package kscopeprom

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
)

// Options configure the metrics.
type Options struct {
	// Registerer receives the metrics. Default: a registry of their own,
	// served by Metrics.Handler.
	Registerer prometheus.Registerer

	// DurationBuckets are the handling-duration histogram's buckets, in
	// seconds. Default: 1ms to 10s.
	DurationBuckets []float64

	// EventTypeHeader, when set, is the record header whose value names
	// the record's event type ("OrderPlaced"): kscope_records_processed_total
	// then has an event_type label with it (EventTypeNone for a record
	// without the header). Empty (the default): no event_type label.
	EventTypeHeader string
	// EventTypeLimit bounds the event_type label's values: the first
	// EventTypeLimit event types seen are labeled by name, any later one
	// EventTypeOther, and counted in kscope_event_type_overflow_total.
	// Default (0): DefaultEventTypeLimit. Only with EventTypeHeader.
	EventTypeLimit int
}

// Metrics is a kscope hook that keeps Prometheus metrics.
type Metrics struct {
	reg      prometheus.Registerer
	gatherer prometheus.Gatherer

	received  *prometheus.CounterVec
	processed *prometheus.CounterVec
	retries   *prometheus.CounterVec
	overruns  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	inFlight  *prometheus.GaugeVec
	lag       *prometheus.GaugeVec
	lagAge    *prometheus.GaugeVec
	paused    *prometheus.GaugeVec
	breakers  *prometheus.GaugeVec
	heldKeys  *prometheus.GaugeVec
	dedupeNA  *prometheus.CounterVec
	gaps      *prometheus.CounterVec
	keyHolds  *prometheus.CounterVec
	trans     *prometheus.CounterVec
	commits   *prometheus.CounterVec
	routes    *prometheus.CounterVec
	lateness  *prometheus.HistogramVec
	rebal     *prometheus.CounterVec
	stalled   *prometheus.GaugeVec
	held      *prometheus.GaugeVec
	decode    *prometheus.CounterVec
	pauses    *prometheus.GaugeVec
	dead      *prometheus.CounterVec
	dups      *prometheus.CounterVec
	overflow  *prometheus.CounterVec
	events    *eventTypes // nil without Options.EventTypeHeader

	relayMu sync.Mutex
	relays  *relayCollector // registered at the first WatchRelay

	waitingMu sync.Mutex
	waiting   *prometheus.GaugeVec // kscope_dead_letters_waiting, registered at the first WatchDeadLetters

	shareMu sync.Mutex
	shares  *shareCollector      // registered at the first WatchShare
	backlog *prometheus.GaugeVec // kscope_share_backlog_records, registered at the first WatchShareGroup
}

// The hooks Metrics implements.
var (
	_ hook.RecordHook        = (*Metrics)(nil)
	_ hook.RecordEventHook   = (*Metrics)(nil)
	_ hook.FetchHook         = (*Metrics)(nil)
	_ hook.RouteHook         = (*Metrics)(nil)
	_ hook.CommitHook        = (*Metrics)(nil)
	_ hook.LagHook           = (*Metrics)(nil)
	_ hook.RebalanceHook     = (*Metrics)(nil)
	_ hook.RetryLatenessHook = (*Metrics)(nil)
	_ hook.StallHook         = (*Metrics)(nil)
	_ hook.HoldHook          = (*Metrics)(nil)
	_ hook.PauseHook         = (*Metrics)(nil)
	_ hook.BreakerHook       = (*Metrics)(nil)
)

// New creates the metrics and registers them.
func New(o Options) (*Metrics, error) {
	events, err := newEventTypes(o)
	if err != nil {
		return nil, err
	}
	m := &Metrics{reg: o.Registerer, events: events}
	if m.reg == nil {
		r := prometheus.NewRegistry()
		m.reg, m.gatherer = r, r
	} else if g, ok := m.reg.(prometheus.Gatherer); ok {
		m.gatherer = g
	} else {
		m.gatherer = prometheus.DefaultGatherer
	}
	buckets := o.DurationBuckets
	if len(buckets) == 0 {
		buckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	}
	gt := []string{"consumer_group", "topic"}
	gtp := []string{"consumer_group", "topic", "partition"}
	m.received = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_records_received_total", Help: "Records polled."}, gt)
	processed := append(gt[:len(gt):len(gt)], "outcome")
	if events != nil {
		processed = append(processed, "event_type")
	}
	m.processed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_records_processed_total", Help: "Deliveries by durable outcome."}, processed)
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_handler_retries_total", Help: "Failed handler attempts retried in place, by reason (the failure class, or timeout)."}, append(gt, "reason"))
	m.overruns = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_handler_overruns_total", Help: "Handler calls still running past consumer.Config.HandlerTimeout and HandlerGrace (they ignore their context)."}, gt)
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kscope_handling_duration_seconds", Help: "From the start of a delivery to its durable outcome.", Buckets: buckets}, gt)
	m.inFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kscope_in_flight_records", Help: "Records polled and not finished."}, gtp)
	m.lag = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kscope_consumer_lag_records", Help: "High watermark minus the lowest unfinished offset."}, gtp)
	m.lagAge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kscope_consumer_lag_seconds", Help: "Age of the oldest unfinished record (on a retry topic, from its due time)."}, gtp)
	m.paused = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kscope_partition_paused", Help: "1 while fetching the partition is paused (backpressure or a held retry record)."}, gtp)
	m.commits = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_offset_commits_total", Help: "Offset commit requests (and committed or failed transactions) by topic whose offsets they carried, and result."}, append(gt, "result"))
	m.routes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_route_produces_total", Help: "Retry and dead-letter produces by result."}, append(gt, "route", "class", "result"))
	m.lateness = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kscope_retry_lateness_seconds", Help: "How late after their due time held retry records were released.",
		Buckets: []float64{.01, .05, .1, .5, 1, 5, 30}}, gt)
	m.rebal = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_rebalances_total", Help: "Partition assignments, revocations and losses."}, []string{"consumer_group", "kind"})
	m.stalled = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kscope_stalled_key_shards", Help: "Key-shards that have finished none of their records for consumer.Config.StallWarning (a handler that does not return)."}, []string{"consumer_group", "topic"})
	m.held = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kscope_held_key_shards", Help: "Key-shards holding their records because the deployment is wrong (a missing table or column, a refused privilege): nothing is routed for them."}, []string{"consumer_group", "reason"})
	m.decode = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_decode_failures_total", Help: "Records dead-lettered because their payload could not be decoded."}, append(gt, "format"))
	m.pauses = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kscope_paused", Help: "While a pause of fetching (consumer.Runner.Pause, consumer.PauseFrom) is in force: when it began, in Unix seconds."}, []string{"consumer_group", "target", "reason"})
	m.breakers = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kscope_breaker_state", Help: "A circuit breaker's state (consumer.Config.Breakers): 0 closed, 1 half-open, 2 open."}, []string{"consumer_group", "breaker"})
	m.trans = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_breaker_transitions_total", Help: "A circuit breaker's changes of state, by the state entered (closed, half-open, open)."}, []string{"consumer_group", "breaker", "state"})
	m.heldKeys = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kscope_held_keys", Help: "Keys their circuit breakers hold in memory (consumer.Config.KeyBreaker)."}, []string{"consumer_group"})
	m.keyHolds = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_key_holds_total", Help: "Times a key's circuit breaker held it (its failures, or a failed probe)."}, gt)
	m.dedupeNA = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_dedupe_unavailable_total", Help: "Records the AtLeastOnce scope handled while its dedupe store did not answer (consumer.FailOpen)."}, gt)
	m.gaps = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kscope_version_gaps_total", Help: "Version gaps found (event=\"found\") and gaps the missing versions filled (event=\"healed\")."}, append(gt, "event"))
	m.newHandbookMetrics()
	for _, c := range []prometheus.Collector{m.gaps, m.dead, m.dups, m.overflow, m.dedupeNA, m.received, m.processed, m.retries, m.overruns, m.duration, m.inFlight, m.lag, m.lagAge, m.paused, m.commits, m.routes, m.lateness, m.rebal, m.stalled, m.held, m.decode, m.pauses, m.breakers, m.trans, m.heldKeys, m.keyHolds} {
		if err := m.reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Handler serves the metrics in the Prometheus exposition format: the
// private registry's, the Registerer's when it is also a Gatherer (a
// *prometheus.Registry), else prometheus.DefaultGatherer's.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.gatherer, promhttp.HandlerOpts{})
}

// Gatherer returns what Handler serves.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.gatherer }

// OnRecordStart implements hook.RecordHook.
func (m *Metrics) OnRecordStart(ctx context.Context, _ hook.RecordStart) context.Context {
	return ctx
}

// OnRecordEnd implements hook.RecordHook.
func (m *Metrics) OnRecordEnd(_ context.Context, e hook.RecordEnd) {
	if e.Outcome == hook.OutcomeAborted {
		return
	}
	if m.events == nil {
		m.processed.WithLabelValues(e.Group, e.Record.Topic, string(e.Outcome)).Inc()
	} else {
		m.processedByType(e)
	}
	m.duration.WithLabelValues(e.Group, e.Record.Topic).Observe(e.Duration.Seconds())
}

// OnRecordEvent implements hook.RecordEventHook: in-place retries,
// duplicates, decode failures, handler overruns, key holds and dedupe
// store outages.
func (m *Metrics) OnRecordEvent(_ context.Context, group string, r *kgo.Record, ev hook.Event, detail string) {
	switch ev {
	case hook.EventRetry:
		m.retries.WithLabelValues(group, r.Topic, orUnknown(detail)).Inc()
	case hook.EventDuplicate:
		m.dups.WithLabelValues(group, r.Topic, orUnknown(detail)).Inc()
	case hook.EventDecodeFailure:
		format, _, _ := strings.Cut(detail, " ")
		m.decode.WithLabelValues(group, r.Topic, format).Inc()
	case hook.EventHandlerOverrun:
		m.overruns.WithLabelValues(group, r.Topic).Inc()
	case hook.EventKeyHeld:
		m.keyHolds.WithLabelValues(group, r.Topic).Inc()
	case hook.EventDedupeUnavailable:
		m.dedupeNA.WithLabelValues(group, r.Topic).Inc()
	case hook.EventVersionGap:
		m.gaps.WithLabelValues(group, r.Topic, "found").Inc()
	case hook.EventVersionHeal:
		m.gaps.WithLabelValues(group, r.Topic, "healed").Inc()
	}
}

// OnFetch implements hook.FetchHook.
func (m *Metrics) OnFetch(f hook.Fetch) {
	m.received.WithLabelValues(f.Group, f.Topic).Add(float64(f.Records))
}

// OnRoute implements hook.RouteHook.
func (m *Metrics) OnRoute(r hook.Route) {
	m.routes.WithLabelValues(r.Group, r.Topic, r.Kind, r.Class, result(r.Err)).Inc()
	if r.Kind == "dlt" && r.Err == nil {
		m.dead.WithLabelValues(r.Group, r.Topic, deadReason(r)).Inc()
	}
}

// OnCommit implements hook.CommitHook.
func (m *Metrics) OnCommit(c hook.Commit) {
	res := result(c.Err)
	if len(c.Topics) == 0 {
		m.commits.WithLabelValues(c.Group, "", res).Inc()
		return
	}
	for _, t := range c.Topics {
		m.commits.WithLabelValues(c.Group, t, res).Inc()
	}
}

// OnLag implements hook.LagHook.
func (m *Metrics) OnLag(l hook.Lag) {
	p := strconv.Itoa(int(l.Partition))
	m.lag.WithLabelValues(l.Group, l.Topic, p).Set(float64(l.Offsets))
	m.lagAge.WithLabelValues(l.Group, l.Topic, p).Set(l.Age.Seconds())
	m.inFlight.WithLabelValues(l.Group, l.Topic, p).Set(float64(l.InFlight))
	paused := 0.0
	if l.Paused {
		paused = 1
	}
	m.paused.WithLabelValues(l.Group, l.Topic, p).Set(paused)
}

// OnPartitionGone implements hook.LagHook: the partition's series go.
func (m *Metrics) OnPartitionGone(group, topic string, partition int32) {
	p := strconv.Itoa(int(partition))
	for _, g := range []*prometheus.GaugeVec{m.lag, m.lagAge, m.inFlight, m.paused} {
		g.DeleteLabelValues(group, topic, p)
	}
}

// OnRebalance implements hook.RebalanceHook.
func (m *Metrics) OnRebalance(r hook.Rebalance) {
	m.rebal.WithLabelValues(r.Group, r.Kind).Inc()
}

// OnRetryLateness implements hook.RetryLatenessHook.
func (m *Metrics) OnRetryLateness(group, topic string, late time.Duration) {
	m.lateness.WithLabelValues(group, topic).Observe(late.Seconds())
}

// OnStall implements hook.StallHook.
func (m *Metrics) OnStall(s hook.Stall) {
	g := m.stalled.WithLabelValues(s.Group, s.Topic)
	if s.Ended {
		g.Dec()
	} else {
		g.Inc()
	}
}

// OnHold implements hook.HoldHook.
func (m *Metrics) OnHold(h hook.Hold) {
	m.held.WithLabelValues(h.Group, h.Reason).Set(float64(h.Shards))
}

// OnKeyHold implements hook.KeyHoldHook.
func (m *Metrics) OnKeyHold(h hook.KeyHold) {
	m.heldKeys.WithLabelValues(h.Group).Set(float64(h.Keys))
}

// OnPause implements hook.PauseHook: the series of a pause in force holds
// when it began; it is deleted when the pause ends.
func (m *Metrics) OnPause(p hook.Pause) {
	if !p.Paused {
		m.pauses.DeleteLabelValues(p.Group, p.Target, p.Reason)
		return
	}
	m.pauses.WithLabelValues(p.Group, p.Target, p.Reason).Set(float64(p.Since.UnixNano()) / 1e9)
}

// OnBreaker implements hook.BreakerHook: kscope_breaker_state takes the
// breaker's new state, and kscope_breaker_transitions_total counts the
// change.
func (m *Metrics) OnBreaker(b hook.Breaker) {
	v := 0.0
	switch b.State {
	case "half-open":
		v = 1
	case "open":
		v = 2
	}
	m.breakers.WithLabelValues(b.Group, b.Name).Set(v)
	m.trans.WithLabelValues(b.Group, b.Name, b.State).Inc()
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}
