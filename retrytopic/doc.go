// Package retrytopic is kscope's failure routing: how a handler error is
// classified, what happens next (an in-place retry, a delayed retry topic,
// a skip or the dead-letter topic), and the headers a routed record carries.
//
// # Classification
//
// A handler returns a plain error or marks it: [Skip] for a business
// rejection (acknowledged, counted, logged, not a failure), [Terminal] or
// [DecodeError] for poison (dead-lettered at once), [Retryable] for a
// transient failure (the full budget: by default one pass through every
// rung of the ladder, 12 attempts, or 6 in place where the retry topics are
// not used); anything else is unknown (default 3 attempts, in place only).
// Policy.Classify overrides.
//
// # Retries
//
// A failing record is first retried in place (Policy.InPlaceAttempts per
// hop, backoff from 1s doubling to 5m, starting over on every hop, with
// jitter), which holds only its key-shard. Then it climbs the delayed retry topics (Policy.Ladder, default
// 5s, 1m, 10m; named per consumer group by [RetryTopic], so another group
// reading the same source never sees them). The consumer holds a retry
// record until its due time by pausing its partition, never by sleeping in
// a handler. Once its budget is spent it goes to the dead-letter topic
// ([DLTopic], per group). Attempts count across hops.
//
// # Per-key order across retries
//
// By default later records of a key do not overtake one in the retry
// topics. The DB scope parks them in PostgreSQL, in the same transaction:
// they are sent to the retry topic of the oldest one and run after it
// succeeds, is skipped or is dead-lettered; other keys keep flowing. The
// AtLeastOnce scope has no store to park in, so for keyed records it keeps
// every retry in place (order holds across restarts too: an unfinished
// record is redelivered first) and uses the retry topics only when the
// policy is Unordered. Records with a null key retry in place unless
// Unordered, keeping their partition order.
//
// # Headers
//
// A routed record keeps its key, value and headers and adds the kscope-*
// headers of [Metadata]: identity, original topic, partition, offset,
// timestamp and key, consumer group, attempt count, first and last failure
// time, error message and class, and on retry topics the due time and
// ladder step. Values are bounded (MaxErrorLength, MaxKeyLength); a forged
// or corrupt header cannot block a partition (a far-future due time waits at
// most its topic's delay) or loop (a huge attempt count spends the budget).
// Policy.SpringHeaders adds Spring Kafka's kafka_dlt-* headers.
//
// The kscope command (cmd/kscope) lists, shows and redrives dead-letter
// records and replays a stopped group.
package retrytopic
