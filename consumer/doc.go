// Package consumer is kscope's entry point: a Kafka consumer group member
// that hands every record to the serial worker of its key-shard and commits
// offsets only for work that is done.
//
// # What it guarantees
//
//   - Per-key order: records with the same topic and key are handled one at a
//     time, in offset order. Records with a null key are ordered per
//     partition unless Config.NullKeys says otherwise. Different keys run in
//     parallel on Config.Shards workers.
//   - No overlap: within one process no record is handled by two workers at
//     once, across rebalances too (a key always maps to the same worker).
//   - The commit never passes unfinished work: a partition's committed
//     offset is the lowest offset whose effect is not yet durable, however
//     out of order the workers finish.
//   - Clean rebalances: on revoke the runner stops feeding the revoked
//     partitions, lets running records finish (bounded by
//     Config.DrainTimeout), commits what is durable, then lets the
//     rebalance go on. On a lost partition it commits nothing.
//   - Bounded memory: at Config.MaxInFlightRecords or
//     Config.MaxInFlightBytes the runner stops polling, and when the bound
//     holds past a burst it pauses fetching for the busiest partitions;
//     nothing is dropped.
//   - Clean shutdown: Run returns after its context is canceled with every
//     goroutine it started gone and every durable offset committed.
//
// # Scopes
//
// A runner's scope says where "exactly once" holds. [New] builds the
// AtLeastOnce scope: nothing is lost, and a record is handled again after a
// crash or rebalance if its offset was not committed yet, so its handler's
// effects must be idempotent. The DB scope (effects in PostgreSQL applied
// exactly once, package dbscope) and the Kafka scope (transactional
// Kafka-to-Kafka, package txn) run on this same runner, as units of work
// plugged into it: one poll loop, one hold of not-yet-due retry records,
// one retry loop and one commit watermark for all three. The AtLeastOnce
// scope commits offsets every Config.CommitInterval; the DB scope makes a
// batch durable in its PostgreSQL transaction before the runner commits
// its offsets; the Kafka scope's records join a Kafka transaction, which
// the runner ends with the offsets.
//
// # Several topics
//
// One runner consumes Config.Topics and every topic the regular
// expressions of Config.TopicPatterns match, including topics created
// after it started. A [Router] hands each record to the handler
// registered for its topic, a header value on its topic (an event type),
// or a pattern its topic matches, or to a default; dbscope.Router and
// txn.Router do the same in the other scopes. The constructors refuse a
// router that leaves a consumed topic without a route (see
// [RouteChecker]); docs/routing.md has the details.
//
// # Around every handler call
//
// Before a handler sees a record, Config.Keep may filter it out and
// Config.MaxAge expire it (skipped or dead-lettered, Config.Expired);
// either way it is done in its key's order and its offset committed.
// Config.HandlerTimeout puts a deadline on each call and reports a call
// that runs on past it. [Middleware] wraps a handler ([Chain]; kscope's
// own are [Recover] and [Timeout]), as dbscope.Middleware and
// txn.Middleware do in the other scopes; docs/middleware.md has the
// details.
//
// # Failures
//
// A handler error is classified ([Skip], [Terminal], [DecodeError],
// [Retryable], or unknown) and routed by Config.Failures: retried in place,
// sent to a delayed retry topic, skipped, or sent to the dead-letter topic
// with its failure metadata; see package retrytopic. Nothing is lost: the
// offset of a failing record is not committed until its route is
// acknowledged. A handler that panics fails like one that returns an error
// (class unknown) whose message is "kscope: handler panicked: " and the
// panic's value; the process goes on. The panic's stack is logged once per
// record, in the "stack" attribute of the first line about the record
// that carries it; the lines of its later attempts, and its dead-letter
// record's error header, carry the value alone.
//
// # Observability
//
// Config.Hooks takes observers, found by the interfaces of package hook
// they implement: deliveries and their outcomes, span context for the
// handler, fetches, routing, commits, lag per partition, rebalances. This
// package imports no metrics or tracing library; packages kscopeprom
// (Prometheus) and kscopeotel (OpenTelemetry) are the adapters. Logs go to
// Config.Logger (log/slog), structured, with keys cut short and payloads
// never logged.
package consumer
