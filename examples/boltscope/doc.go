// Package boltscope is a scope for a bbolt file (go.etcd.io/bbolt), built
// on kscope's public contract alone (packages scope and consumer, run by
// consumer.NewScoped): the DB scope's guarantee, in miniature, for a
// service whose state is a local key/value file instead of PostgreSQL. It
// is an example of a scope written outside kscope's own packages; its test
// runs kscopetest's delivery-semantics table on it (kscopetest.Scope).
//
// # What it guarantees
//
// Each record is applied in one bbolt read-write transaction that holds
// both the handler's writes and the record's inbox entry, keyed by the
// record's identity (consumer.Config.Identity: kscope's identity header
// on a retry or dead-letter hop, the producer's "message-id" header, an
// extractor, or the record's topic/partition/offset). The record is
// reported done, and its offset may be committed, only after that
// transaction committed. A record whose inbox entry exists — a
// redelivery after a crash or a rebalance, a duplicate produce, a replay
// from the start of the topic — is skipped without calling the handler
// and counted in consumer.Stats.DB.Duplicates. Each record's effect in the
// file is therefore applied exactly once.
//
// A handler error rolls the record's transaction back and goes to the
// runner's failure policy (consumer.Config.Failures): the record is
// retried in place with backoff, holding its key-shard, so later records
// of its key wait behind it (per-key order, also across restarts); once
// its budget is spent, or at once for a terminal or decode error, it goes
// to the dead-letter topic, and it is done only once the broker has the
// dead letter. Its inbox entry then says so: a later copy of it is a
// duplicate, unless an operator redrove it from the dead-letter topic
// (retrytopic.HeaderRedrive), which applies it. A business skip
// (consumer.Skip) commits the handler's writes with the inbox entry, as
// the DB scope does. With consumer.Config.Failures.Unordered, a failing
// record moves through the delayed retry topics instead of holding its
// key-shard, and later records of its key overtake it; the inbox still
// applies it once, whichever copy succeeds first.
//
// An error of the file itself (a failed commit, a closed or read-only
// file) is not the record's fault: the record and those behind it on its
// key-shard wait, reported in consumer.Stats.Hold, and the transaction is
// retried after the runner's backoff, which grows while it fails, until it
// commits.
//
// # What it does not cover
//
//   - Anything the handler does outside tx: an HTTP call, an email, a
//     write to another store is at-least-once unless it carries an
//     idempotency key.
//   - More than one member. A bbolt file is one process's: its inbox
//     knows only the records applied to it. Run one member per consumer
//     group (one replica, its file on a volume that survives restarts).
//     The scope cannot tell that a group has other members; a second
//     member with a file of its own would, after a rebalance, apply again
//     records the first one applied. bbolt's file lock keeps a second
//     process on the same host from opening the same file (bolt.Open
//     waits for it, or fails after bolt.Options.Timeout).
//   - Inbox retention. The inbox keeps one entry per record for good (a
//     few dozen bytes each, in the bucket [InboxBucket]); a service that
//     must bound it deletes old entries itself, accepting that a record
//     redelivered after that is applied again.
//   - Throughput across keys. bbolt has one write transaction at a time,
//     and each record's handler runs in one and commits (syncing the
//     file) on its own: the key-shards take turns at the file, so its
//     commit latency bounds the records applied per second.
//
// A handler must not commit or roll back tx (bbolt panics; the panic
// becomes the record's failure), nor keep tx or values read from it after
// it returns, nor write to [InboxBucket].
package boltscope
