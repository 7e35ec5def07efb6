package consumer

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Hook observes a runner. It is any value that implements one or more of
// the Hook* interfaces below; kscope finds them by type assertion when the
// runner is built (Config.Hooks) and calls only those. kscope itself
// imports no metrics or tracing library: the kscopeprom and kscopeotel
// packages are hooks for Prometheus and OpenTelemetry. With no hooks, the
// hot path does no observability work at all.
//
// Hooks are called from the runner's goroutines, concurrently, and must not
// block: a slow hook slows consumption.
type Hook any

// Outcome is how one delivery of a record ended.
type Outcome string

// Outcomes of a delivery.
const (
	OutcomeSuccess      Outcome = "success"       // the handler's effects are durable
	OutcomeDuplicate    Outcome = "duplicate"     // already applied (an inbox hit): not handled again
	OutcomeRetried      Outcome = "retried"       // sent to a retry topic, to be handled again later
	OutcomeParked       Outcome = "parked"        // sent behind an earlier failing record of its key
	OutcomeDeadLettered Outcome = "dead_lettered" // sent to the dead-letter topic
	OutcomeSkipped      Outcome = "skipped"       // a business outcome (Skip): acknowledged, not retried
	OutcomeStale        Outcome = "stale"         // at or below its key's last applied version: skipped
	OutcomeGap          Outcome = "gap"           // ahead of its key's next version: waits for the versions before it
	// OutcomeAborted: the delivery did not finish here (the partition
	// was revoked, the runner stopped, or the transaction aborted); the
	// record is delivered again, to this member or the next owner.
	OutcomeAborted Outcome = "aborted"
)

// Event names a step in a delivery, reported to HookRecordEvent (a span
// event in kscopeotel).
type Event string

// Events of a delivery.
const (
	EventDuplicate   Event = "kscope.dedupe_hit"   // the inbox already holds the record
	EventRetry       Event = "kscope.retry"        // a failed attempt is retried in place
	EventRetryTopic  Event = "kscope.retry_topic"  // routed to a retry topic
	EventDeadLetter  Event = "kscope.dead_letter"  // routed to the dead-letter topic
	EventVersionGap  Event = "kscope.version_gap"  // ahead of its key's next version
	EventVersionHeal Event = "kscope.version_heal" // applied after waiting for the versions before it
)

// RecordStart is what HookRecord receives when a delivery starts.
type RecordStart struct {
	Group  string
	Record *Record
}

// RecordEnd is what HookRecord receives when a delivery ends.
type RecordEnd struct {
	Group    string
	Record   *Record
	Outcome  Outcome
	Duration time.Duration // from the start of the delivery to its durable outcome
	Err      error         // the last handler error, if any
}

// HookRecord is called around every delivery of a record to a scope: once
// when it starts (the context it returns is the one the handler gets) and
// once when its outcome is durable. A delivery is one pass of a record
// through a scope: in-place retries belong to it; a hop through a retry
// topic is a new delivery.
type HookRecord interface {
	OnRecordStart(ctx context.Context, s RecordStart) context.Context
	OnRecordEnd(ctx context.Context, e RecordEnd)
}

// HookRecordEvent is called at the steps of a delivery named by Event.
// detail is a short, safe description (a topic name, "expected 3, got 5"),
// never a payload.
type HookRecordEvent interface {
	OnRecordEvent(ctx context.Context, group string, r *Record, ev Event, detail string)
}

// HookInject is called on every record kscope produces on behalf of a
// delivery (a retry or dead-letter record, a Kafka-scope output), with the
// delivery's context, so that the record carries the trace on.
type HookInject interface {
	InjectRecord(ctx context.Context, r *kgo.Record)
}

// Fetch is what HookFetch receives for each partition of each poll.
type Fetch struct {
	Group     string
	Topic     string
	Partition int32
	Records   int
}

// HookFetch is called for every partition a poll returned records of.
type HookFetch interface {
	OnFetch(f Fetch)
}

// Route is what HookRoute receives when a record was produced to a retry
// or dead-letter topic, or the attempt failed.
type Route struct {
	Group  string
	Topic  string // the source topic
	Kind   string // "retry" or "dlt"
	Class  string // the failure's class (retrytopic.Class), or "parked" for a record sent behind its key's failing one
	Err    error  // nil when the broker acknowledged it
	Target string // the retry or dead-letter topic
}

// HookRoute is called after every produce attempt of a routed record.
type HookRoute interface {
	OnRoute(r Route)
}

// Commit is what HookCommit receives after an offset commit request.
type Commit struct {
	Group      string
	Partitions int
	Err        error
}

// HookCommit is called after every offset commit request.
type HookCommit interface {
	OnCommit(c Commit)
}

// Lag is one assigned partition's position, reported by HookLag.
type Lag struct {
	Group     string
	Topic     string
	Partition int32
	Offsets   int64         // records not finished: the high watermark minus the lowest unfinished offset
	Age       time.Duration // age of the oldest unfinished record (0 when none is in flight)
	InFlight  int           // records polled and not finished
	Paused    bool          // fetching is paused (backpressure or a held retry record)
}

// HookLag is called for every assigned partition at every commit interval
// (OnLag), and when a partition leaves this member (OnPartitionGone, so that
// its series can be removed).
type HookLag interface {
	OnLag(l Lag)
	OnPartitionGone(group, topic string, partition int32)
}

// Rebalance is what HookRebalance receives.
type Rebalance struct {
	Group      string
	Kind       string // "assigned", "revoked" or "lost"
	Partitions int
}

// HookRebalance is called on every assignment, revocation and loss.
type HookRebalance interface {
	OnRebalance(r Rebalance)
}

// HookRetryLateness is called when a held retry-topic record is released,
// with how late after its due time that was.
type HookRetryLateness interface {
	OnRetryLateness(group, topic string, late time.Duration)
}

// Observer dispatches a runner's hooks. Scopes get theirs from
// the runner's failures (internal/engine.ObserverOf); every method is a no-op (and allocation-free) when
// no hook implements its interface.
type observer struct {
	group     string
	record    []HookRecord
	event     []HookRecordEvent
	inject    []HookInject
	fetch     []HookFetch
	route     []HookRoute
	commit    []HookCommit
	lag       []HookLag
	rebalance []HookRebalance
	lateness  []HookRetryLateness
}

// NewObserver returns the Observer of group's hooks.
func newObserver(group string, hooks []Hook) *observer {
	o := &observer{group: group}
	for _, h := range hooks {
		if x, ok := h.(HookRecord); ok {
			o.record = append(o.record, x)
		}
		if x, ok := h.(HookRecordEvent); ok {
			o.event = append(o.event, x)
		}
		if x, ok := h.(HookInject); ok {
			o.inject = append(o.inject, x)
		}
		if x, ok := h.(HookFetch); ok {
			o.fetch = append(o.fetch, x)
		}
		if x, ok := h.(HookRoute); ok {
			o.route = append(o.route, x)
		}
		if x, ok := h.(HookCommit); ok {
			o.commit = append(o.commit, x)
		}
		if x, ok := h.(HookLag); ok {
			o.lag = append(o.lag, x)
		}
		if x, ok := h.(HookRebalance); ok {
			o.rebalance = append(o.rebalance, x)
		}
		if x, ok := h.(HookRetryLateness); ok {
			o.lateness = append(o.lateness, x)
		}
	}
	return o
}

// Start begins a delivery of r: it calls the HookRecord hooks and keeps the
// context they return, and the start time, on r. It returns that context.
func (o *observer) Start(ctx context.Context, r *Record) context.Context {
	if o == nil || len(o.record) == 0 {
		return ctx
	}
	if r.obs == nil {
		r.obs = new(recordObs)
	}
	r.obs.start = time.Now()
	for _, h := range o.record {
		ctx = h.OnRecordStart(ctx, RecordStart{Group: o.group, Record: r})
	}
	r.obs.ctx = ctx
	r.obs.ended = false
	return ctx
}

// Context returns the delivery context Start kept on r, or ctx when there
// is none.
func (o *observer) Context(ctx context.Context, r *Record) context.Context {
	if r.obs != nil && r.obs.ctx != nil {
		return r.obs.ctx
	}
	return ctx
}

// End ends r's delivery with outcome out (once: later calls for the same
// delivery are ignored). err is the last handler error, if any.
func (o *observer) End(r *Record, out Outcome, err error) {
	if o.Ended(r) {
		return
	}
	r.obs.ended = true
	e := RecordEnd{Group: o.group, Record: r, Outcome: out, Duration: time.Since(r.obs.start), Err: err}
	for _, h := range o.record {
		h.OnRecordEnd(r.obs.ctx, e)
	}
}

// Ended reports whether r's delivery was ended (or never started).
func (o *observer) Ended(r *Record) bool {
	return o == nil || len(o.record) == 0 || r.obs == nil || r.obs.ctx == nil || r.obs.ended
}

// Event reports a step of r's delivery.
func (o *observer) Event(r *Record, ev Event, detail string) {
	if o == nil || len(o.event) == 0 {
		return
	}
	ctx := o.Context(context.Background(), r)
	for _, h := range o.event {
		h.OnRecordEvent(ctx, o.group, r, ev, detail)
	}
}

// Inject lets the hooks mark out, a record produced for the delivery whose
// context is ctx.
func (o *observer) Inject(ctx context.Context, out *kgo.Record) {
	if o == nil {
		return
	}
	for _, h := range o.inject {
		h.InjectRecord(ctx, out)
	}
}

// Route reports a produce attempt of a routed record (r.Group is filled
// in).
func (o *observer) Route(r Route) {
	if o == nil || len(o.route) == 0 {
		return
	}
	r.Group = o.group
	for _, h := range o.route {
		h.OnRoute(r)
	}
}

// Commit reports an offset commit request.
func (o *observer) Commit(partitions int, err error) {
	if o == nil {
		return
	}
	for _, h := range o.commit {
		h.OnCommit(Commit{Group: o.group, Partitions: partitions, Err: err})
	}
}

// Rebalance reports an assignment, revocation or loss.
func (o *observer) Rebalance(kind string, partitions int) {
	if o == nil {
		return
	}
	for _, h := range o.rebalance {
		h.OnRebalance(Rebalance{Group: o.group, Kind: kind, Partitions: partitions})
	}
}

// Fetched reports the records a poll returned for one partition.
func (o *observer) Fetched(topic string, partition int32, n int) {
	if o == nil {
		return
	}
	for _, h := range o.fetch {
		h.OnFetch(Fetch{Group: o.group, Topic: topic, Partition: partition, Records: n})
	}
}

// Lag reports one partition's position.
func (o *observer) Lag(l Lag) {
	if o == nil {
		return
	}
	l.Group = o.group
	for _, h := range o.lag {
		h.OnLag(l)
	}
}

// Gone reports that a partition left this member.
func (o *observer) Gone(topic string, partition int32) {
	if o == nil {
		return
	}
	for _, h := range o.lag {
		h.OnPartitionGone(o.group, topic, partition)
	}
}

// Lateness reports a released retry-topic record's lateness.
func (o *observer) Lateness(topic string, late time.Duration) {
	if o == nil {
		return
	}
	for _, h := range o.lateness {
		h.OnRetryLateness(o.group, topic, late)
	}
}

// WantsFetch reports whether a hook observes fetches.
func (o *observer) WantsFetch() bool { return o != nil && len(o.fetch) > 0 }

// WantsLag reports whether a hook observes lag.
func (o *observer) WantsLag() bool { return o != nil && len(o.lag) > 0 }
