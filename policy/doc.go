// Package policy reads the operating policy a service ships for its
// consumers: one YAML file, one entry per consumer group, that says what
// each consumer is and how it may be operated. An entry declares the
// consumer's scope (at_least_once, db or kafka), its owning team and how to
// reach them, its failure policy (the retry ladder, the budgets, the
// in-place attempts and the backoff), its dead-letter topic and that
// topic's retention, whether a replay is allowed, its lag objective (in
// seconds, at p95) and, for a consumer that checks per-key versions, its gap
// policy.
//
//	version: 1
//	consumers:
//	  - group: payments-ledger
//	    scope: db
//	    owner: {team: payments, contact: "#payments-oncall"}
//	    replay: true
//	    failures:
//	      backoff: 200ms
//	      max_backoff: 10s
//	      in_place_attempts: 2
//	      ladder: [5s, 1m]
//	    dead_letter: {retention: 720h}
//	    lag_objective: {p95_seconds: 120}
//	    gaps: {policy: wait, timeout: 10m, on_timeout: dead_letter}
//
// [Load] and [Parse] decode strictly: a field the format does not have is an
// error, as is a value of the wrong type or a missing required field
// (version and consumers; in each consumer group, scope, owner and replay).
// Then the file is validated with the library's own checks (those of
// retrytopic.Policy and sequence.Config), and every problem is reported at
// once, each naming the file, the line, the consumer, the field and what to
// change ([Problem]).
//
// A runner is built from an entry with [Consumer.Apply], which fills a
// consumer.Config's failure policy, and [Consumer.ApplyGaps], which fills
// the gap options of a scope's Versions. Code stays the source of truth:
// a field the Config sets (not left at its zero value) wins over the
// policy's, and the disagreement is logged as a warning and returned as a
// [Conflict].
//
// The kscope CLI reads the same file (kscope --policy FILE, or
// KSCOPE_POLICY): kscope policy check validates it, and kscope replay
// refuses a consumer group whose entry says replay: false. [Schema] is the
// file's JSON Schema, for editors. See docs/policy.md.
package policy
