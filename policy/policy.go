package policy

import (
	"log/slog"
	"time"
)

// FormatVersion is the version of the file format this package reads: a
// file says it in its version field.
const FormatVersion = 1

// DefaultLagObjective is the lag objective of a consumer whose entry
// declares none: two minutes at p95, as the delivery-semantics handbook
// recommends for a consumer on a critical path.
const DefaultLagObjective = 2 * time.Minute

// File is a policy file: one entry per consumer group.
type File struct {
	// Version is the format's version: FormatVersion. Required.
	Version int `yaml:"version" policy:"required"`
	// Consumers are the entries, one per consumer group. Required.
	Consumers []Consumer `yaml:"consumers" policy:"required"`

	// path is the name the file was read as (Load's path, Parse's name).
	path string
	// index locates the file's fields, for the problems' lines.
	index *index
}

// Path returns the name the file was read as: Load's path, or Parse's
// name ("" for a File built in code).
func (f *File) Path() string { return f.path }

// Consumer returns the entry of consumer group group.
func (f *File) Consumer(group string) (Consumer, bool) {
	for _, c := range f.Consumers {
		if c.Group == group {
			return c, true
		}
	}
	return Consumer{}, false
}

// Consumer is one consumer group's policy.
type Consumer struct {
	// Group is the consumer group id (consumer.Config.Group). Required.
	Group string `yaml:"group" policy:"required"`
	// Scope is the consumer's delivery scope. Required.
	Scope Scope `yaml:"scope" policy:"required"`
	// Owner is the team that owns the consumer and answers for its dead
	// letters. Required.
	Owner Owner `yaml:"owner" policy:"required"`
	// Replay says whether kscope replay may move the group's committed
	// offsets: false for a consumer whose effects must not run again
	// (kscope replay refuses it). Required: a policy says it either way.
	Replay bool `yaml:"replay" policy:"required"`
	// Critical says that one dead letter of the consumer pages its owner
	// (the alert KscopeDeadLetterOnCriticalPipeline, through the
	// kscope_pipeline_info series Rules records). Default false.
	Critical bool `yaml:"critical,omitempty"`
	// Dedupe is the dedupe store an at_least_once consumer runs with
	// (consumer.Config.Dedupe.Store). Only in the at_least_once scope (the
	// db scope's inbox and the kafka scope's changelog dedupe already).
	// Omitted, it reads as DedupeNone: kscope replay refuses the consumer
	// without --force and a reason (see ReplayDeduped).
	Dedupe DedupeStore `yaml:"dedupe,omitempty"`
	// Failures is the failure policy (consumer.Config.Failures). Omitted,
	// the library's defaults apply.
	Failures *Failures `yaml:"failures,omitempty"`
	// DeadLetter is the dead-letter topic and its retention. Omitted, the
	// topic is <group>.kscope-dlt, kept without limit.
	DeadLetter *DeadLetter `yaml:"dead_letter,omitempty"`
	// LagObjective is how far behind the consumer may fall. Omitted,
	// DefaultLagObjective applies (see LagP95).
	LagObjective *LagObjective `yaml:"lag_objective,omitempty"`
	// Gaps is the gap policy of a consumer that checks per-key versions
	// (the db and kafka scopes' Options.Versions). Omitted, the scope's
	// defaults apply.
	Gaps *Gaps `yaml:"gaps,omitempty"`

	// file is the path of the file the entry was read from.
	file string
}

// File returns the path of the file the entry was read from ("" for an
// entry built in code).
func (c Consumer) File() string { return c.file }

// LagP95 returns the consumer's lag objective at p95: the declared one, or
// DefaultLagObjective.
func (c Consumer) LagP95() time.Duration {
	if c.LagObjective == nil || c.LagObjective.P95Seconds <= 0 {
		return DefaultLagObjective
	}
	return time.Duration(c.LagObjective.P95Seconds) * time.Second
}

// Scope is a consumer's delivery scope.
type Scope string

// The scopes.
const (
	// ScopeAtLeastOnce is package consumer's AtLeastOnce scope.
	ScopeAtLeastOnce Scope = "at_least_once"
	// ScopeDB is package dbscope's: effectively-once in PostgreSQL.
	ScopeDB Scope = "db"
	// ScopeKafka is package txn's: exactly-once within Kafka.
	ScopeKafka Scope = "kafka"
)

// scopes are the valid Scope values, in the schema's order.
var scopes = []string{string(ScopeAtLeastOnce), string(ScopeDB), string(ScopeKafka)}

// DedupeStore is the kind of dedupe store an at_least_once consumer runs
// with (consumer.DedupeConfig.Store).
type DedupeStore string

// The dedupe stores.
const (
	// DedupeRedis is redisstore's store: shared, kept across restarts.
	DedupeRedis DedupeStore = "redis"
	// DedupePostgres is dedupe.NewPostgres: shared, kept across restarts.
	DedupePostgres DedupeStore = "postgres"
	// DedupeMemory is dedupe.NewMemory: one process's, lost when it
	// stops, so it forgets what it saw before a replay (which needs the
	// group stopped).
	DedupeMemory DedupeStore = "memory"
	// DedupeNone is a consumer without a dedupe store: a replay runs its
	// handler again for every record.
	DedupeNone DedupeStore = "none"
)

var dedupeStores = []string{string(DedupeRedis), string(DedupePostgres), string(DedupeMemory), string(DedupeNone)}

// ReplayDeduped reports whether records a replay gives the consumer again
// are recognised as handled: always in the db and kafka scopes (the inbox,
// the changelog); in the at_least_once scope only with a store that
// outlives the consumer's processes (redis, postgres). kscope replay
// refuses a consumer for which it is false, unless forced with a reason.
func (c Consumer) ReplayDeduped() bool {
	if c.Scope != ScopeAtLeastOnce {
		return true
	}
	return c.Dedupe == DedupeRedis || c.Dedupe == DedupePostgres
}

// Owner is the team that owns a consumer.
type Owner struct {
	// Team is the owning team's name. Required.
	Team string `yaml:"team" policy:"required"`
	// Contact is how to reach them: a channel, an address, a pager
	// rotation. Required.
	Contact string `yaml:"contact" policy:"required"`
}

// String returns the owner as consumer.Config.Owner holds it and the
// kscope-owner header carries it: "team <contact>".
func (o Owner) String() string {
	if o.Contact == "" {
		return o.Team
	}
	return o.Team + " <" + o.Contact + ">"
}

// Failures is a failure policy: the fields of retrytopic.Policy that a file
// declares, under their YAML names. A field left out (or zero) takes the
// library's default.
type Failures struct {
	// Backoff is the first in-place wait (retrytopic.Policy.Backoff).
	Backoff Duration `yaml:"backoff,omitempty"`
	// MaxBackoff bounds the in-place waits (Policy.MaxBackoff).
	MaxBackoff Duration `yaml:"max_backoff,omitempty"`
	// InPlaceAttempts is the attempts per hop (Policy.InPlaceAttempts).
	InPlaceAttempts int `yaml:"in_place_attempts,omitempty"`
	// RetryableAttempts is the budget of a retryable failure
	// (Policy.RetryableAttempts).
	RetryableAttempts int `yaml:"retryable_attempts,omitempty"`
	// UnknownAttempts is the budget of an unclassified failure
	// (Policy.UnknownAttempts).
	UnknownAttempts int `yaml:"unknown_attempts,omitempty"`
	// Ladder is the delay of each retry topic, increasing (Policy.Ladder).
	Ladder []Duration `yaml:"ladder,omitempty"`
	// DisableRetryTopics keeps every retry in place
	// (Policy.DisableRetryTopics).
	DisableRetryTopics bool `yaml:"disable_retry_topics,omitempty"`
	// Unordered lets later records of a key overtake one in the retry
	// topics (Policy.Unordered).
	Unordered bool `yaml:"unordered,omitempty"`
}

// DeadLetter is a consumer's dead-letter topic.
type DeadLetter struct {
	// Topic is the dead-letter topic (Policy.DeadLetterTopic). Default
	// retrytopic.DLTopic(group).
	Topic string `yaml:"topic,omitempty"`
	// Retention is the retention the topic is created with
	// (Policy.DeadLetterRetention). Default: unlimited.
	Retention Duration `yaml:"retention,omitempty"`
}

// LagObjective is how far behind its topics a consumer may fall.
type LagObjective struct {
	// P95Seconds is the lag, in seconds, that the consumer stays under 95%
	// of the time. Required.
	P95Seconds int `yaml:"p95_seconds" policy:"required"`
}

// Gaps is the gap policy: what a consumer that checks per-key versions
// does with a record whose version is ahead of the next one due (the
// fields of sequence.Config that a file declares).
type Gaps struct {
	// Policy is sequence.Config.Gaps. Required.
	Policy GapPolicy `yaml:"policy" policy:"required"`
	// Timeout bounds a wait (sequence.Config.GapTimeout). Only with
	// policy wait.
	Timeout Duration `yaml:"timeout,omitempty"`
	// OnTimeout is what becomes of a record that waited Timeout
	// (sequence.Config.OnTimeout). Default dead_letter; only with policy
	// wait.
	OnTimeout TimeoutPolicy `yaml:"on_timeout,omitempty"`
	// First is which first version of a new key is accepted
	// (sequence.Config.First). Default any.
	First FirstVersion `yaml:"first,omitempty"`
	// Header is the header the version is read from
	// (sequence.Config.Header). Default "version".
	Header string `yaml:"header,omitempty"`
}

// GapPolicy is what a gap does: sequence.GapPolicy, by name.
type GapPolicy string

// The gap policies.
const (
	GapWait       GapPolicy = "wait"        // sequence.Wait
	GapDeadLetter GapPolicy = "dead_letter" // sequence.DeadLetter
	GapAccept     GapPolicy = "accept"      // sequence.Accept
)

var gapPolicies = []string{string(GapWait), string(GapDeadLetter), string(GapAccept)}

// TimeoutPolicy is what becomes of a record that waited out a gap's
// timeout: sequence.TimeoutPolicy, by name.
type TimeoutPolicy string

// The timeout policies.
const (
	TimeoutDeadLetter TimeoutPolicy = "dead_letter" // sequence.TimeoutDeadLetter
	TimeoutAccept     TimeoutPolicy = "accept"      // sequence.TimeoutAccept: wait, then accept
)

var timeoutPolicies = []string{string(TimeoutDeadLetter), string(TimeoutAccept)}

// FirstVersion is which first version of a key is accepted:
// sequence.FirstPolicy, by name.
type FirstVersion string

// The first-version policies.
const (
	FirstAny       FirstVersion = "any" // sequence.FirstAny
	FirstMustBeOne FirstVersion = "one" // sequence.FirstMustBeOne
)

var firstVersions = []string{string(FirstAny), string(FirstMustBeOne)}

// logger returns l, or slog.Default() when nil.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}
