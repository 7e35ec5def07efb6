package consumer

// Stats are a runner's own counters, for tests and health checks. Metrics
// for dashboards come from the observability hooks.
type Stats struct {
	InFlight         int64    // records polled and not yet finished, less those Held
	InFlightBytes    int64    // their key, value and header bytes
	MaxInFlight      int64    // the highest InFlight seen
	MaxInFlightBytes int64    // the highest InFlightBytes seen
	Polled           int64    // records dispatched to key-shards
	Done             int64    // records whose effect is durable
	PausedPartitions int      // partitions paused for backpressure now
	Held             int64    // records held back now: delay-topic records waiting for their due time, records of a Kafka-scope partition waiting for one of its commit.MaxUndone dispatch slots, and the records behind either in their partition
	RetryLateness    Lateness // how late held records were released
	Pauses           int64    // times a partition was paused for backpressure
	Assigned         int      // partitions assigned now
	// GroupProtocol is the consumer group protocol the member's client
	// uses, as its requests to the group coordinator show (a JoinGroup:
	// classic; a ConsumerGroupHeartbeat: consumer): Config.GroupProtocol,
	// unless the client fell back to classic. Empty until the client
	// first joins, and for a share group.
	GroupProtocol  GroupProtocol
	Rebalances     int64 // assignments, revocations and losses seen
	LostPartitions int64 // partitions lost (taken without a revoke)
	Commits        int64 // offset commit requests that succeeded
	CommitErrors   int64 // offset commit requests that failed
	StalledShards  int   // key-shards that have finished none of their records for Config.StallWarning, now
	Failures       FailureStats
	// Hold says whether key-shards hold their records because the
	// deployment is wrong (a missing table, a refused privilege): see
	// HoldStats. [Runner.Health] reports the runner not ready while
	// Hold.Shards is above 0.
	Hold HoldStats
	// The handler call's rules (Config.Keep, MaxAge, HandlerTimeout),
	// in every scope. DB.Skipped and Kafka.Skipped count filtered and
	// expired skips too, as every record their scope finished as a skip.
	Filtered        int64 // records Config.Keep filtered out (outcome filtered), their offsets committed
	Expired         int64 // records older than Config.MaxAge: skipped (outcome expired) or dead-lettered (outcome dead_lettered, counted as a dead letter too)
	HandlerOverruns int64 // handler calls still running HandlerGrace past their HandlerTimeout (each reported once)
	// Waiting says why Run has not started consuming, while it waits for
	// what its scope needs at start: in the DB scope, a database that does
	// not answer (with its address and the last error), for up to
	// dbscope.Options.StartTimeout; in the Kafka scope with Versions or
	// Dedupe, the state of newly assigned partitions, while it is
	// restored from their changelogs (at start and after each
	// assignment, with the last failed attempt). Empty otherwise.
	// [Runner.Health] reports the runner not ready while it is set.
	Waiting string
	// Paused are the pauses in force (Runner.Pause, PauseFrom): what
	// each holds, since when and why.
	Paused []PausedTarget
	// RateLimit counts the waits for Config.RateLimit.
	RateLimit RateStats
	// Breakers are the circuit breakers' states (Config.Breakers), in
	// their order.
	Breakers []BreakerState
	// KeyBreaker counts the work of the circuit breaker of each key
	// (Config.KeyBreaker).
	KeyBreaker KeyBreakerStats
	// Dedupe counts the AtLeastOnce scope's idempotency guard's work
	// (Config.Dedupe).
	Dedupe DedupeStats
	// Share are a share-group runner's counters (Config.Share); zero for a
	// consumer group's.
	Share ShareStats
	DB    DBStats    // the DB scope's counters (package dbscope); zero in the other scopes
	Kafka KafkaStats // the Kafka scope's counters (package txn); zero in the other scopes

	// Periodic counts the calls of the periodic work (Config.Periodic,
	// or the scope's own, dbscope.Options.Periodic), in every scope.
	Periodic PeriodicStats
}

// DBStats are the DB scope's counters (package dbscope), in [Stats].DB.
type DBStats struct {
	Applied       int64 // records whose handler committed
	Duplicates    int64 // records skipped because their inbox row existed
	ReplaySkipped int64 // records skipped before the handler thanks to stored offsets
	Failed        int64 // handler failures (retried or dead-lettered by the failure policy)
	Skipped       int64 // records whose handler returned a business skip (their writes commit unless a failed statement aborted them)
	Parked        int64 // records stored behind an earlier record of their key that is in the retry topics
	Stale         int64 // records whose version was at or below their key's last applied one: skipped
	GapsDetected  int64 // records found ahead of their key's next version
	GapsHealed    int64 // records applied after waiting for the versions before them
	GapsAccepted  int64 // records applied over a gap (sequence.Accept)
	GapsTimedOut  int64 // records that waited past GapTimeout and went to the DLT
	// VersionsSkipped counts the versions that gaps were applied over
	// (sequence.Accept, or sequence.TimeoutAccept once GapTimeout passed):
	// never applied; one that arrives later is stale.
	VersionsSkipped int64
	// GapsFilled counts the records past a gap whose missing state
	// dbscope.Options.FillGap rebuilt: applied.
	GapsFilled   int64
	TxRetries    int64 // transactions retried after a transient PostgreSQL error
	Transactions int64 // transactions committed
	// HeldKeys is how many keys their circuit breaker holds
	// (Config.KeyBreaker) in PostgreSQL, as the last recovery pass
	// (every 2 s) counted them.
	HeldKeys int
}

// KafkaStats are the Kafka scope's counters (package txn), in [Stats].Kafka.
type KafkaStats struct {
	Records      int64 // input records whose outputs (or route) committed
	Outputs      int64 // output records committed
	Committed    int64 // transactions committed
	Aborted      int64 // transactions aborted (rebalance, fault) and replayed
	DeadLettered int64 // input records dead-lettered inside a transaction
	Skipped      int64 // input records skipped as business outcomes
	RetryTopic   int64 // input records sent to a delayed retry topic inside a transaction
	Held         int64 // retry-topic records found not yet due (their partition paused until due)
	Stale        int64 // versioned records at or below their key's last version, skipped
	GapsDetected int64 // versioned records parked ahead of their key's next version
	GapsHealed   int64 // parked records applied once the versions before them were
	GapsAccepted int64 // records applied over a gap (sequence.Accept)
	GapsTimedOut int64 // parked records that waited past GapTimeout and went to the DLT
	// VersionsSkipped counts the versions that gaps were applied over
	// (sequence.Accept, or sequence.TimeoutAccept once GapTimeout passed).
	VersionsSkipped int64
	// GapsFilled counts the inputs past a gap whose missing state
	// txn.Options.FillGap rebuilt: applied.
	GapsFilled int64
	Duplicates int64 // input records whose identity was remembered (txn.Options.Dedupe): no output, committed
}
