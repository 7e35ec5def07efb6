package consumer

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
)

// Observer dispatches a runner's hooks. Scopes get theirs from
// the runner's failures (scope.Engine.Observer); every method is a no-op (and allocation-free) when
// no hook implements its interface.
type observer struct {
	group     string
	record    []hook.RecordHook
	event     []hook.RecordEventHook
	inject    []hook.InjectHook
	fetch     []hook.FetchHook
	route     []hook.RouteHook
	commit    []hook.CommitHook
	lag       []hook.LagHook
	rebalance []hook.RebalanceHook
	lateness  []hook.RetryLatenessHook
	stall     []hook.StallHook
	hold      []hook.HoldHook

	// The handler call's counters (Stats.Filtered, Expired,
	// HandlerOverruns), kept whether or not a hook observes.
	filtered, expired, overruns atomic.Int64
}

// NewObserver returns the Observer of group's hooks.
func newObserver(group string, hooks []hook.Hook) *observer {
	o := &observer{group: group}
	for _, h := range hooks {
		if x, ok := h.(hook.RecordHook); ok {
			o.record = append(o.record, x)
		}
		if x, ok := h.(hook.RecordEventHook); ok {
			o.event = append(o.event, x)
		}
		if x, ok := h.(hook.InjectHook); ok {
			o.inject = append(o.inject, x)
		}
		if x, ok := h.(hook.FetchHook); ok {
			o.fetch = append(o.fetch, x)
		}
		if x, ok := h.(hook.RouteHook); ok {
			o.route = append(o.route, x)
		}
		if x, ok := h.(hook.CommitHook); ok {
			o.commit = append(o.commit, x)
		}
		if x, ok := h.(hook.LagHook); ok {
			o.lag = append(o.lag, x)
		}
		if x, ok := h.(hook.RebalanceHook); ok {
			o.rebalance = append(o.rebalance, x)
		}
		if x, ok := h.(hook.RetryLatenessHook); ok {
			o.lateness = append(o.lateness, x)
		}
		if x, ok := h.(hook.StallHook); ok {
			o.stall = append(o.stall, x)
		}
		if x, ok := h.(hook.HoldHook); ok {
			o.hold = append(o.hold, x)
		}
	}
	return o
}

// Start begins a delivery of r: it calls the hook.RecordHook hooks and keeps the
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
		ctx = h.OnRecordStart(ctx, hook.RecordStart{Group: o.group, Record: r.Record})
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
func (o *observer) End(r *Record, out hook.Outcome, err error) {
	if r.turned != admitted && (out == hook.OutcomeSkipped || out == hook.OutcomeDeadLettered) && o.open(r) {
		out, err = o.admitted(r, out, err)
	}
	if o.Ended(r) {
		return
	}
	r.obs.ended = true
	e := hook.RecordEnd{Group: o.group, Record: r.Record, Outcome: out, Duration: time.Since(r.obs.start), Err: err}
	for _, h := range o.record {
		h.OnRecordEnd(r.obs.ctx, e)
	}
}

// Ended reports whether r's delivery was ended (or never started).
func (o *observer) Ended(r *Record) bool {
	return o == nil || len(o.record) == 0 || r.obs == nil || r.obs.ctx == nil || r.obs.ended
}

// Event reports a step of r's delivery.
func (o *observer) Event(r *Record, ev hook.Event, detail string) {
	if o == nil || len(o.event) == 0 {
		return
	}
	ctx := o.Context(context.Background(), r)
	for _, h := range o.event {
		h.OnRecordEvent(ctx, o.group, r.Record, ev, detail)
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
func (o *observer) Route(r hook.Route) {
	if o == nil || len(o.route) == 0 {
		return
	}
	r.Group = o.group
	for _, h := range o.route {
		h.OnRoute(r)
	}
}

// Commit reports an offset commit request, which carried the offsets of
// topics.
func (o *observer) Commit(partitions int, err error, topics ...string) {
	if o == nil {
		return
	}
	for _, h := range o.commit {
		h.OnCommit(hook.Commit{Group: o.group, Partitions: partitions, Err: err, Topics: topics})
	}
}

// Rebalance reports an assignment, revocation or loss.
func (o *observer) Rebalance(kind string, partitions int) {
	if o == nil {
		return
	}
	for _, h := range o.rebalance {
		h.OnRebalance(hook.Rebalance{Group: o.group, Kind: kind, Partitions: partitions})
	}
}

// Fetched reports the records a poll returned for one partition.
func (o *observer) Fetched(topic string, partition int32, n int) {
	if o == nil {
		return
	}
	for _, h := range o.fetch {
		h.OnFetch(hook.Fetch{Group: o.group, Topic: topic, Partition: partition, Records: n})
	}
}

// Lag reports one partition's position.
func (o *observer) Lag(l hook.Lag) {
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

// Stall reports a key-shard's stall, or its end.
func (o *observer) Stall(s hook.Stall) {
	if o == nil {
		return
	}
	s.Group = o.group
	for _, h := range o.stall {
		h.OnStall(s)
	}
}

// Hold reports a change in the key-shards holding their records.
func (o *observer) Hold(h hook.Hold) {
	if o == nil {
		return
	}
	h.Group = o.group
	for _, x := range o.hold {
		x.OnHold(h)
	}
}

// WantsFetch reports whether a hook observes fetches.
func (o *observer) WantsFetch() bool { return o != nil && len(o.fetch) > 0 }

// WantsLag reports whether a hook observes lag.
func (o *observer) WantsLag() bool { return o != nil && len(o.lag) > 0 }
