package consumer

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/partition"
	"github.com/kscope-dev/kscope/retrytopic"
)

// NullKeyPolicy says how records without a key are routed to key-shards.
type NullKeyPolicy = partition.NullKeyPolicy

const (
	// NullKeyOrdered handles the null-key records of a partition serially,
	// in offset order (the default).
	NullKeyOrdered = partition.NullKeyOrdered
	// NullKeySpread spreads null-key records over every key-shard, with no
	// order between them.
	NullKeySpread = partition.NullKeySpread
)

// Defaults applied by [Config] to fields left at their zero value.
const (
	DefaultShards             = 16
	DefaultMaxInFlightRecords = 100_000
	DefaultMaxInFlightBytes   = 64 << 20
	DefaultDrainTimeout       = 15 * time.Second
	DefaultRebalanceTimeout   = 60 * time.Second
	DefaultCommitInterval     = time.Second
	maxShards                 = 4096
)

// Config configures one consumer group member. The zero value of every
// optional field selects the documented default; a Config that contradicts
// itself is rejected by [New] with an error that says what to change.
type Config struct {
	// Brokers are the seed brokers, as host:port. Required. When none of
	// them can be reached, Run returns an error wrapping
	// [ErrBrokersUnreachable] within 20 seconds (or the kgo.RetryTimeout
	// of ClientOptions). Java client equivalent: bootstrap.servers.
	Brokers []string

	// Group is the consumer group id. Required. Java: group.id.
	// Retry topics, the dead-letter topic and committed offsets are named
	// by it, and the DB scope's inbox by default: a group renamed between
	// two deployments starts from the reset offset (the earliest by
	// default), and the records the earlier group left in its retry topics
	// are consumed by a member of that group only. On a group's first
	// start the runner warns of each other group that consumed its topics
	// and still has records in its retry topics.
	Group string

	// Owner is the team that owns the consumer and answers for its dead
	// letters, and how to reach it, as "team <contact>" (such as
	// "payments <#payments-oncall>"). The runner writes it as the
	// kscope-owner header (retrytopic.HeaderOwner) on every record it
	// sends to the dead-letter topic or a retry topic, in every scope,
	// and kscope dlt list and dlt show print it. policy.Consumer.Apply
	// fills it from the policy file's owner. At most
	// retrytopic.MaxOwnerLength bytes of printable text. Empty by
	// default: no header.
	Owner string

	// Topics are the topics to consume. Required, without duplicates,
	// unless TopicPatterns is set.
	Topics []string

	// TopicPatterns are regular expressions (Go syntax, as franz-go's
	// kgo.ConsumeRegex reads them: an expression matches anywhere in a
	// name unless anchored with ^ and $): the runner also consumes every
	// topic one of them matches, including topics created after it
	// started, which it finds at its next metadata refresh (every
	// DefaultPatternRefresh, unless ClientOptions set kgo.MetadataMaxAge).
	// A pattern never matches kscope's own topics (retry, dead-letter and
	// version changelog topics, of any group): a matched topic's failing
	// records go to this group's retry and dead-letter topics as a named
	// topic's do. Not supported by the Kafka scope (txn.New), which joins
	// the group only once its producer is ready and then adds named
	// topics. Java: subscribe(Pattern).
	TopicPatterns []string

	// ClientOptions are passed to franz-go's kgo.NewClient before kscope's
	// own options: use them for TLS (kgo.DialTLSConfig), SASL (kgo.SASL),
	// a client id, fetch sizes, or another group balancer. kscope always
	// sets, after these, the options its guarantees depend on: the seed
	// brokers, group and topics above, autocommit off, rebalances blocked
	// while a poll is being dispatched, the rebalance callbacks and the
	// rebalance timeout. Defaults set before these options, and therefore
	// overridable: the cooperative-sticky balancer, read_committed
	// isolation, and a fetch max wait of 500ms (Java's fetch.max.wait.ms;
	// franz-go's own default is 5s, which delays a partition resumed after
	// backpressure by up to that long).
	ClientOptions []kgo.Opt

	// Shards is the number of key-shard workers: records with the same
	// topic and key are handled serially by one of them, different keys in
	// parallel. Default 16; at most 4096. For I/O-bound handlers the
	// throughput ceiling is about Shards / handler latency.
	Shards int

	// MaxInFlightRecords bounds the records that are polled and not yet
	// finished (queued or running). The runner polls while at least half
	// the bound is free, and a poll takes only what fits, so the bound is
	// never passed; polling into half the bound lets a poll take the
	// fetch response the client buffered whole, and the client fetches the
	// next one while the workers run this one. If the bound holds for more
	// than 100ms the runner also pauses fetching for the partitions that
	// hold the most unfinished records. Nothing is dropped.
	// Default 100,000. Each in-flight record costs about 300 bytes of
	// bookkeeping on top of its key, value and headers; a consumer whose
	// slow handler keeps it at the bound on a backlog of 200-byte records
	// peaks at 85 to 100 MiB of RSS (BENCHMARKS.md, "Peak RSS"). A
	// smaller bound trades a very fast handler's throughput for memory
	// (BENCHMARKS.md, "r1 against the in-flight bound").
	// Queued records of a revoked partition are dropped, not drained, so
	// the bound does not lengthen a rebalance.
	// Retry-topic records held until their due time do not count: their
	// partition is paused, so at most a fetch's worth of each is held, and
	// a retry backlog never stops the source topics.
	// Java equivalent (roughly): max.poll.records.
	MaxInFlightRecords int

	// MaxInFlightBytes bounds the key, value and header bytes of unfinished
	// records the same way. A poll asks for as many records as fit at the
	// average record size seen so far, so records much larger than the
	// average can pass the bound by their difference. Default 64 MiB.
	MaxInFlightBytes int64

	// DrainTimeout bounds how long a revoke (or shutdown) waits for the
	// records of the revoked partitions that are already running. Past it,
	// their context is canceled and the rebalance goes on; what finished is
	// committed. Default 15s; must be shorter than RebalanceTimeout.
	DrainTimeout time.Duration

	// RebalanceTimeout is how long the group waits for members to rejoin
	// during a rebalance. Default 60s. Java: max.poll.interval.ms (its role
	// in a rebalance).
	RebalanceTimeout time.Duration

	// GroupProtocol is the consumer group protocol the member joins with:
	// [GroupProtocolClassic] (the default) or [GroupProtocolConsumer]
	// (KIP-848: the broker assigns partitions and members reconcile one
	// by one, with no group-wide barrier). Classic is the default because
	// it runs on every broker kscope supports, while the consumer
	// protocol needs Kafka 4.0+ and franz-go recommends it only from
	// Kafka 4.3 (before that an offset commit can fail with
	// STALE_MEMBER_EPOCH during a reconciliation). Under the consumer
	// protocol the runner's balancer is the broker's: ClientOptions'
	// kgo.Balancers must put kgo.RangeBalancer or a sticky balancer
	// first (the runner's default, cooperative-sticky, asks for the
	// broker's uniform assignor), or the client joins with the classic
	// protocol; a broker without the consumer protocol gets the classic
	// one too. [Stats].GroupProtocol and the runner's log line at join
	// report the protocol actually in use. Java: group.protocol. Not
	// used by a share group (Config.Share).
	GroupProtocol GroupProtocol

	// InstanceID makes the member static (KIP-345; Java:
	// group.instance.id): a member that restarts with the same id within
	// the group's session timeout (45s by default: kgo.SessionTimeout in
	// ClientOptions under the classic protocol, the broker's
	// group.consumer.session.timeout.ms under the consumer protocol) gets
	// its partitions back
	// without a rebalance of the other members (under the classic
	// protocol; under the consumer protocol Apache Kafka 4.3.1 was seen
	// to hand them to the others and back), and a member that stops
	// does not leave the group: its partitions wait for it, unassigned,
	// for up to the session timeout. The drain and commit rules are
	// unchanged: a stop drains the running records and commits what
	// finished before the client closes. Each member needs its own id, stable
	// across its restarts: a Kubernetes StatefulSet's pod name (the
	// POD_NAME from the downward API, such as orders-2) is one; a
	// Deployment's pod names are random per pod, so a restarted pod comes
	// back as a new member and the old id's partitions wait out the
	// session timeout unconsumed (see docs/operations.md). Two running
	// members with one id fence each other: the broker refuses the
	// second. Both protocols. At most 249 characters of
	// letters, digits, '.', '_' and '-'. Empty by default: a dynamic
	// member. Not used by a share group (Config.Share).
	InstanceID string

	// CommitInterval is how often durable offsets are committed. Offsets are
	// also committed on revoke and on shutdown. Default 1s.
	// Java: auto.commit.interval.ms (for a manual-commit consumer).
	CommitInterval time.Duration

	// StallWarning is how long a key-shard may hold a record without
	// finishing it before the runner logs a WARN naming the record
	// (topic, partition, offset, key), counts the key-shard in
	// Stats.StalledShards and tells the hook.StallHook hooks
	// (kscope_stalled_key_shards in kscopeprom). A handler that never
	// returns (a call with no timeout that ignores its context) holds
	// every key of its key-shard, keeps its partition's offsets where they
	// are, and, once the in-flight bound fills behind it, stops the
	// consumer; nothing else names it. The runner does not cancel the
	// handler: give its calls timeouts, or honor its context. The waits
	// between retries in place (the failure policy's backoff) do not
	// count; a DB-scope transaction, or the routing of a failure to a
	// retry or dead-letter topic, that runs longer is reported too.
	// Default 1 minute; a negative value turns the watch off.
	StallWarning time.Duration

	// HandlerTimeout puts a deadline on each handler call's context, in
	// every scope (0: none, the default). A call that fails once the
	// deadline passed fails with an error that matches
	// [ErrHandlerTimeout] and is of class retryable unless the handler's
	// error carries a class of its own: it is retried, then routed, by
	// Failures like any transient failure (a call that returns nil after
	// its deadline succeeded). A call still running HandlerGrace after
	// its deadline ignores its context: the runner logs a WARN naming the
	// record once, counts it in Stats.HandlerOverruns and reports
	// hook.EventHandlerOverrun (kscope_handler_overruns_total in
	// kscopeprom); it cannot stop the call, and StallWarning goes on
	// reporting its key-shard. The Timeout middleware of each scope puts
	// the same deadline on one handler.
	HandlerTimeout time.Duration

	// HandlerGrace is how long a call may run on past HandlerTimeout
	// before it is reported as ignoring its context. Default
	// DefaultHandlerGrace; only with HandlerTimeout.
	HandlerGrace time.Duration

	// Keep, when set, is asked about each record before any handler
	// sees it: a record for which it returns false is filtered out. Its
	// handler is not called; it is done in its key's order, its offset
	// committed like any finished record's, counted in Stats.Filtered
	// and ended with hook.OutcomeFiltered; it is not logged one by one.
	// Keep reads a header, the key or the value (decode the value in it
	// to keep by a field); it runs on the key-shard's worker, must not
	// block and must be safe for concurrent use. Records of the group's
	// retry topics passed it when they were first consumed and are not
	// asked again. A panic in Keep is the record's failure, routed by
	// Failures.
	Keep func(r *Record) bool

	// MaxAge, when set, expires a record older than it (by its
	// timestamp; for a record of a retry topic, by the timestamp of the
	// original record, so that one that waited in the retry topics past
	// MaxAge expires) before any handler sees it. What becomes of it is
	// Expired's choice; either way it is done in its key's order and
	// counted in Stats.Expired. A record without a timestamp does not
	// expire.
	MaxAge time.Duration

	// Expired says what becomes of a record older than MaxAge: sent to
	// the dead-letter topic with its failure metadata (ExpiredDeadLetter,
	// the default: nothing is lost) or skipped, its offset committed
	// (ExpiredSkip, outcome hook.OutcomeExpired). Only with MaxAge.
	Expired ExpiredAction

	// NullKeys says how records without a key are routed. Default
	// NullKeyOrdered.
	NullKeys NullKeyPolicy

	// Logger receives the runner's structured logs. Default slog.Default().
	Logger *slog.Logger

	// Identity says how a record's identity (its dedupe key, carried on
	// every hop) is found: kscope's own header from an earlier hop, a
	// producer-set header (default "message-id"), an extractor, or the
	// record's original topic/partition/offset.
	Identity Identity

	// Failures says what happens to a record whose handler failed: retried
	// in place with backoff by class, skipped, or sent to the dead-letter
	// topic with its failure metadata. The zero value is the default
	// policy; see retrytopic.Policy.
	Failures retrytopic.Policy

	// RateLimit bounds how fast handlers are called: records (and bytes)
	// a second, of the runner, of a topic, of a key; taken before each
	// handler call. No limit by default. See [RateLimit] and
	// docs/flow-control.md.
	RateLimit RateLimit

	// Breakers are circuit breakers, one per dependency: the handler
	// errors a breaker matches open it, and while it is open the runner
	// pauses fetching and its records wait in place instead of going
	// through the failure policy (see [BreakerConfig] and
	// docs/flow-control.md#circuit-breakers). None by default.
	Breakers []BreakerConfig

	// Dedupe is the AtLeastOnce scope's idempotency guard, with a
	// per-record handler (New) or a batch handler (NewBatch): with a
	// Store, a record whose identity was remembered after an earlier
	// success is not handled again (see [DedupeConfig] and
	// docs/dedupe.md). Off by default.
	Dedupe DedupeConfig

	// KeyBreaker, when set, is the circuit breaker of each key: a key
	// whose records keep failing is held alone, its records waiting,
	// while every other key flows; after a cool-down one probe record of
	// it goes through, and on success its held records run in order (see
	// [KeyBreakerConfig] and docs/flow-control.md#per-key-circuit-breaker).
	// Off by default.
	KeyBreaker *KeyBreakerConfig

	// Idle calls functions of the service's when a partition, or the
	// whole member, has had no record for a while (see IdleConfig). Off
	// by default.
	Idle IdleConfig

	// Periodic runs a function of the service's on every assigned
	// partition every Periodic.Interval, on the partition's key-shard
	// worker (see PeriodicConfig; the DB scope runs its own,
	// dbscope.Options.Periodic, in a transaction). Off by default.
	Periodic PeriodicConfig

	// Share, when set, makes the runner a member of the share group
	// (KIP-932) named Group instead of a consumer group: its members take
	// records from the same partitions together and acknowledge them one
	// by one, with no order across members (see [ShareConfig] and
	// docs/share-groups.md). Nil by default: a consumer group.
	Share *ShareConfig

	// Hooks observe the runner: metrics, traces, lag (see package hook;
	// the kscopeprom and kscopeotel packages provide them). None by
	// default.
	Hooks []hook.Hook
}

// WithDefaults returns c with its zero fields set to the defaults every
// runner applies (New, NewScoped and the scope packages' constructors), for
// a scope that reads them before the runner is built.
func (c Config) WithDefaults() Config {
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.MaxInFlightRecords == 0 {
		c.MaxInFlightRecords = DefaultMaxInFlightRecords
	}
	if c.MaxInFlightBytes == 0 {
		c.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if c.GroupProtocol == "" {
		c.GroupProtocol = GroupProtocolClassic
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = DefaultRebalanceTimeout
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.StallWarning == 0 {
		c.StallWarning = DefaultStallWarning
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.HandlerTimeout > 0 && c.HandlerGrace == 0 {
		c.HandlerGrace = DefaultHandlerGrace
	}
	if c.Share != nil {
		// Retries stay in place: the retry topics' held records would
		// stop a share-group member's polling (ShareConfig).
		sc := c.Share.withDefaults()
		c.Share = &sc
		c.Failures.DisableRetryTopics = true
	}
	c.Failures = c.Failures.WithDefaults(c.Group)
	return c
}

// ConfigError is returned by [New] for a configuration that cannot work. Its
// message says which field is wrong and what to change.
type ConfigError struct {
	Struct string // the configuration type at fault: "Config", or a scope's "Options"; or the argument at fault, such as "consumer.New's handler"
	Field  string // the field at fault ("" when Struct names an argument)
	Reason string // what is wrong and what to do
}

// Error returns the message: the field at fault and what to change.
func (e *ConfigError) Error() string {
	s := e.Struct
	if s == "" {
		s = "Config"
	}
	if e.Field == "" {
		return "kscope: " + s + ": " + e.Reason // an argument, not a field
	}
	return "kscope: " + s + "." + e.Field + ": " + e.Reason
}

// validate checks a Config that already has its defaults.
func (c Config) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	seen := c.validateSources(bad)
	c.validateBounds(bad)
	c.validateHandlerCall(bad)
	c.validateRateLimit(bad)
	c.validateBreakers(bad)
	c.validateKeyBreaker(bad)
	c.validateDedupe(bad)
	c.validateIdleWork(bad)
	c.validateOwner(bad)
	c.validateGroupMembership(bad)
	for _, pr := range c.Failures.Problems() {
		bad("Failures."+pr.Field, "%s", pr.Reason)
	}
	// A dead letter the runner consumes is handled again, fails again and
	// is dead-lettered again, without end (a retry topic of the group is
	// consumed whether or not the policy names it).
	if dlt := c.Failures.DeadLetterTopic; seen[dlt] {
		bad("Failures.DeadLetterTopic", "%q is one of Topics: its records would be handled and dead-lettered again without end; name a topic the runner does not consume", dlt)
	} else if _, ok := retrytopic.RetryTopicDelay(c.Group, dlt); ok {
		bad("Failures.DeadLetterTopic", "%q is named as one of group %s's retry topics, which the runner consumes: its records would be handled and dead-lettered again without end; name it otherwise (default %s)", dlt, c.Group, retrytopic.DLTopic(c.Group))
	}
	if len(errs) == 0 {
		// Let the client reject options it cannot use (a bad TLS or SASL
		// setup, say) at construction rather than at Run. A client that is
		// not told to consume does not connect.
		opts := append(append([]kgo.Opt{}, c.ClientOptions...), kgo.SeedBrokers(c.Brokers...))
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			bad("ClientOptions", "rejected by the Kafka client: %v", err)
		} else {
			cl.Close()
		}
	}
	return errors.Join(errs...)
}

// validateSources checks where the runner consumes from (brokers, group,
// topics), reports each problem to bad, and returns the topics it saw.
func (c Config) validateSources(bad func(field, format string, args ...any)) (seen map[string]bool) {
	if len(c.Brokers) == 0 {
		bad("Brokers", "no seed broker given; set it to at least one host:port, such as localhost:9092")
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			bad("Brokers", "holds an empty address; remove it or give a host:port")
			break
		}
	}
	if strings.TrimSpace(c.Group) == "" {
		bad("Group", "no consumer group given; set it to the group id this service consumes as")
	}
	if len(c.Topics) == 0 && len(c.TopicPatterns) == 0 {
		bad("Topics", "no topic given; set it to the topics to consume (or set TopicPatterns)")
	}
	validatePatterns(c.TopicPatterns, bad)
	seen = make(map[string]bool, len(c.Topics))
	for _, t := range c.Topics {
		switch {
		case strings.TrimSpace(t) == "":
			bad("Topics", "holds an empty topic name; remove it")
		case seen[t]:
			bad("Topics", "lists %q twice; list each topic once", t)
		}
		seen[t] = true
	}
	return seen
}

// validateBounds checks the runner's bounds, timeouts and policies, and
// reports each problem to bad.
func (c Config) validateBounds(bad func(field, format string, args ...any)) {
	if c.Shards < 0 || c.Shards > maxShards {
		bad("Shards", "is %d; set it between 1 and %d (0 selects %d)", c.Shards, maxShards, DefaultShards)
	}
	if c.MaxInFlightRecords < 0 {
		bad("MaxInFlightRecords", "is %d; set it to a positive bound (0 selects %d)", c.MaxInFlightRecords, DefaultMaxInFlightRecords)
	}
	if c.MaxInFlightBytes < 0 {
		bad("MaxInFlightBytes", "is %d; set it to a positive bound (0 selects %d)", c.MaxInFlightBytes, DefaultMaxInFlightBytes)
	}
	if c.DrainTimeout < 0 {
		bad("DrainTimeout", "is %s; set it to a positive duration (0 selects %s)", c.DrainTimeout, DefaultDrainTimeout)
	}
	if c.RebalanceTimeout < 0 {
		bad("RebalanceTimeout", "is %s; set it to a positive duration (0 selects %s)", c.RebalanceTimeout, DefaultRebalanceTimeout)
	}
	if c.DrainTimeout > 0 && c.RebalanceTimeout > 0 && c.DrainTimeout >= c.RebalanceTimeout {
		bad("DrainTimeout", "(%s) must be shorter than RebalanceTimeout (%s), or the group evicts this member while it drains; lower DrainTimeout or raise RebalanceTimeout", c.DrainTimeout, c.RebalanceTimeout)
	}
	if c.CommitInterval < 0 {
		bad("CommitInterval", "is %s; set it to a positive duration (0 selects %s)", c.CommitInterval, DefaultCommitInterval)
	}
	if c.StallWarning > 0 && c.StallWarning < 100*time.Millisecond {
		bad("StallWarning", "is %s, shorter than ordinary work on a key-shard, which would be reported as stalled; set it to 100ms or more (0 selects %s, a negative value turns the watch off)", c.StallWarning, DefaultStallWarning)
	}
	if c.NullKeys != NullKeyOrdered && c.NullKeys != NullKeySpread {
		bad("NullKeys", "is %s; use NullKeyOrdered or NullKeySpread", c.NullKeys)
	}
}
