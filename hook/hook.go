// Package hook is how a kscope runner is observed: the interfaces an
// observer implements (RecordHook, FetchHook, LagHook, ...) and what they
// receive. A value given in consumer.Config.Hooks is called through each
// interface it implements. Packages kscopeprom (Prometheus) and kscopeotel
// (OpenTelemetry) are such observers; write your own for another system.
package hook

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Hook observes a runner. It is any value that implements one or more of
// the *Hook interfaces of this package; kscope finds them by type
// assertion when the runner is built (consumer.Config.Hooks) and calls
// only those. kscope itself
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
	OutcomeFiltered     Outcome = "filtered"      // dropped by consumer.Config.Keep before any handler: acknowledged, not handled
	// OutcomeHeld: its key is held by its circuit breaker
	// (consumer.Config.KeyBreaker); the record waits, not done, and is
	// delivered again after the key's probe.
	OutcomeHeld Outcome = "held"
	// OutcomeExpired: older than consumer.Config.MaxAge, skipped before
	// any handler (consumer.ExpiredSkip). An expired record sent to the
	// dead-letter topic (consumer.ExpiredDeadLetter) ends dead_lettered.
	OutcomeExpired Outcome = "expired"
	// OutcomeAborted: the delivery did not finish here (the partition
	// was revoked, the runner stopped, or the transaction aborted); the
	// record is delivered again, to this member or the next owner.
	OutcomeAborted Outcome = "aborted"
)

// Event names a step in a delivery, reported to RecordEventHook (a span
// event in kscopeotel).
type Event string

// Events of a delivery.
const (
	// EventDuplicate: the record repeats one already applied and is not
	// handled again; detail names what found it: "inbox" (the DB scope's
	// inbox or its stored offsets), "dedupe_store" (the AtLeastOnce
	// scope's consumer.Config.Dedupe) or "kafka_guard" (the Kafka scope's
	// txn.Options.Dedupe).
	EventDuplicate Event = "kscope.dedupe_hit"
	// EventRetry: a failed attempt is retried in place; detail is the
	// failure's class ("retryable", "unknown"), or "timeout" for a
	// handler call that ran past consumer.Config.HandlerTimeout. A
	// failure that waits for an open circuit breaker is not a retry.
	EventRetry       Event = "kscope.retry"
	EventRetryTopic  Event = "kscope.retry_topic"  // routed to a retry topic
	EventDeadLetter  Event = "kscope.dead_letter"  // routed to the dead-letter topic
	EventVersionGap  Event = "kscope.version_gap"  // ahead of its key's next version
	EventVersionHeal Event = "kscope.version_heal" // applied after waiting for the versions before it
	// EventKeyHeld: the record's failure opened its key's circuit breaker
	// (consumer.Config.KeyBreaker), or a probe of the key failed: the key
	// is held until its next probe.
	EventKeyHeld Event = "kscope.key_held"
	// EventDedupeUnavailable: the AtLeastOnce scope's dedupe store
	// (consumer.Config.Dedupe) did not answer, and the record is handled
	// without its answer (consumer.FailOpen): it may be a duplicate.
	EventDedupeUnavailable Event = "kscope.dedupe_unavailable"
	// EventDecodeFailure: the record's payload could not be decoded (a
	// retrytopic.DecodeFailure) and it goes to the dead-letter topic;
	// detail is its format and schema id, such as "avro schema-id=7".
	EventDecodeFailure Event = "kscope.decode_failure"
	// EventHandlerOverrun: the handler call runs on past
	// consumer.Config.HandlerTimeout and HandlerGrace (it ignores its
	// context); detail is the two together.
	EventHandlerOverrun Event = "kscope.handler_overrun"
)

// RecordStart is what RecordHook receives when a delivery starts.
type RecordStart struct {
	Group  string
	Record *kgo.Record
}

// RecordEnd is what RecordHook receives when a delivery ends.
type RecordEnd struct {
	Group    string
	Record   *kgo.Record
	Outcome  Outcome
	Duration time.Duration // from the start of the delivery to its durable outcome
	Err      error         // the last handler error, if any
}

// RecordHook is called around every delivery of a record to a scope: once
// when it starts (the context it returns is the one the handler gets) and
// once when its outcome is durable. A delivery is one pass of a record
// through a scope: in-place retries belong to it; a hop through a retry
// topic is a new delivery.
type RecordHook interface {
	OnRecordStart(ctx context.Context, s RecordStart) context.Context
	OnRecordEnd(ctx context.Context, e RecordEnd)
}

// RecordEventHook is called at the steps of a delivery named by Event.
// detail is a short, safe description (a topic name, "expected 3, got 5"),
// never a payload.
type RecordEventHook interface {
	OnRecordEvent(ctx context.Context, group string, r *kgo.Record, ev Event, detail string)
}

// InjectHook is called on every record kscope produces on behalf of a
// delivery (a retry or dead-letter record, a Kafka-scope output), with the
// delivery's context, so that the record carries the trace on.
type InjectHook interface {
	InjectRecord(ctx context.Context, r *kgo.Record)
}

// Fetch is what FetchHook receives for each partition of each poll.
type Fetch struct {
	Group     string
	Topic     string
	Partition int32
	Records   int // records the poll returned, not counting transaction markers
}

// FetchHook is called for every partition a poll returned records of.
type FetchHook interface {
	OnFetch(f Fetch)
}

// Route is what RouteHook receives when a record was produced to a retry
// or dead-letter topic, or the attempt failed.
type Route struct {
	Group  string
	Topic  string // the source topic
	Kind   string // "retry" or "dlt"
	Class  string // the failure's class (retrytopic.Class), or "parked" for a record sent behind its key's failing one
	Err    error  // nil when the broker acknowledged it
	Target string // the retry or dead-letter topic
	// Reason says, for a dead letter (Kind "dlt"), why it was sent there:
	// one of the Reason* constants. Empty for a retry.
	Reason string
}

// Why a record was sent to the dead-letter topic (Route.Reason).
const (
	// ReasonTerminalFailure: its handler failed with a terminal error.
	ReasonTerminalFailure = "terminal_failure"
	// ReasonDeserializationFailure: its payload could not be decoded (a
	// retrytopic.DecodeFailure).
	ReasonDeserializationFailure = "deserialization_failure"
	// ReasonSchemaIncompatible: its payload names a schema the reader
	// cannot use (a retrytopic.DecodeFailure with Incompatible set: a
	// schema id the registry does not have, or a schema the reader's
	// cannot read).
	ReasonSchemaIncompatible = "schema_incompatible"
	// ReasonRetriesExhausted: its failures were retryable (or of no
	// class) and the failure policy's attempts ran out.
	ReasonRetriesExhausted = "retries_exhausted"
	// ReasonExpired: it was older than consumer.Config.MaxAge
	// (consumer.ExpiredDeadLetter).
	ReasonExpired = "expired"
	// ReasonNoRoute: no route of its router handles it
	// (consumer.ErrNoRoute).
	ReasonNoRoute = "no_route"
	// ReasonDeliveriesExhausted: a share group delivered it more times
	// than consumer.ShareConfig.MaxDeliveries (consumer.ErrDeliveriesExhausted):
	// its earlier deliveries crashed their member, outran their lock, or
	// were released unfinished.
	ReasonDeliveriesExhausted = "deliveries_exhausted"
)

// The sources of a duplicate (the detail of EventDuplicate).
const (
	DuplicateInbox       = "inbox"        // the DB scope's inbox (or its stored offsets)
	DuplicateDedupeStore = "dedupe_store" // the AtLeastOnce scope's consumer.Config.Dedupe
	DuplicateKafkaGuard  = "kafka_guard"  // the Kafka scope's txn.Options.Dedupe
)

// RouteHook is called after every produce attempt of a routed record.
type RouteHook interface {
	OnRoute(r Route)
}

// Commit is what CommitHook receives after an offset commit request.
type Commit struct {
	Group      string
	Partitions int
	Err        error
	// Topics are the topics whose offsets the request carried, each
	// once (for a transaction, the topics of the partitions it moved).
	Topics []string
}

// CommitHook is called after every offset commit request.
type CommitHook interface {
	OnCommit(c Commit)
}

// Lag is one assigned partition's position, reported by LagHook.
type Lag struct {
	Group     string
	Topic     string
	Partition int32
	Offsets   int64         // records not finished: the high watermark minus the lowest unfinished offset (a transaction marker is finished once fetched)
	Age       time.Duration // age of the oldest unfinished record (0 when none is in flight); on a retry topic, counted from its due time, so a record waiting for it is not lag
	InFlight  int           // records polled and not finished
	Paused    bool          // fetching is paused (backpressure or a held retry record)
}

// LagHook is called for every assigned partition at every commit interval
// (OnLag), and when a partition leaves this member (OnPartitionGone, so that
// its series can be removed). The last call for a partition that left is
// OnPartitionGone, which may come more than once for one departure (when
// the partition left while its lag was being reported); OnLag for it
// comes again only once it is assigned again.
type LagHook interface {
	OnLag(l Lag)
	OnPartitionGone(group, topic string, partition int32)
}

// Rebalance is what RebalanceHook receives.
type Rebalance struct {
	Group      string
	Kind       string // "assigned", "revoked" or "lost"
	Partitions int
}

// RebalanceHook is called on every assignment, revocation and loss.
type RebalanceHook interface {
	OnRebalance(r Rebalance)
}

// RetryLatenessHook is called when a held retry-topic record is released,
// with how late after its due time that was.
type RetryLatenessHook interface {
	OnRetryLateness(group, topic string, late time.Duration)
}

// Stall is what StallHook receives when a key-shard has finished none of
// its records for longer than consumer.Config.StallWarning, and again when
// it moves on.
type Stall struct {
	Group string
	Shard int // the key-shard (0 to consumer.Config.Shards-1)
	// The record the key-shard holds: its handler has not returned, or the
	// scope's work for it (a transaction, the routing of its failure) has
	// not ended. Every other key of the key-shard waits behind it.
	Topic     string
	Partition int32
	Offset    int64
	For       time.Duration // how long the key-shard has finished nothing
	Ended     bool          // the key-shard moved on (or the runner stopped); For is then the whole stall
}

// StallHook is called when a key-shard stalls (Ended false) and when the
// stall ends (Ended true): every stall reported is ended once, at the
// latest when Run returns.
type StallHook interface {
	OnStall(s Stall)
}

// Hold is what HoldHook receives when the number of key-shards that hold
// their records because the deployment is wrong changes: a statement meets
// a table, column or privilege that is not there (in the DB scope, a
// PostgreSQL error of dbscope.IsDeploymentError). Such a key-shard routes
// nothing to the retry topics or the dead-letter topic for it: it retries
// with backoff and goes on by itself once the deployment is fixed.
type Hold struct {
	Group  string
	Reason string // why the key-shards hold: "deployment"
	Shards int    // key-shards holding now; 0 once every one went on
	Err    error  // the error that started the hold; nil once Shards is 0
}

// KeyHold is the count of keys their circuit breakers hold
// (consumer.Config.KeyBreaker) in a runner's memory (the AtLeastOnce and
// Kafka scopes), reported to a KeyHoldHook each time it changes.
type KeyHold struct {
	Group string
	Keys  int // keys held now
}

// KeyHoldHook is called when a key's circuit breaker starts or stops
// holding it (see KeyHold).
type KeyHoldHook interface {
	OnKeyHold(h KeyHold)
}

// HoldHook is called when key-shards start or stop holding (see Hold): the
// first call of a hold has Shards 1, the last Shards 0.
type HoldHook interface {
	OnHold(h Hold)
}
