// Package outbox is kscope's transactional outbox: records a service
// publishes because its database changed, written in the same PostgreSQL
// transaction as the change, and published to Kafka exactly once by a
// relay.
//
// # Writing
//
// [Add] (or a [Writer] for another outbox) inserts an outgoing record in a
// pgx transaction — a DB-scope handler's, or any write path's — so it is
// published if and only if that transaction commits. A
// dbscope.QueueHandler queues the insert with [Writer.Queue] instead: it
// runs with the record's other statements, in the transaction that holds
// the record's inbox row. Each record gets an identity
// ("<outbox>/<partition>/<seq>"), carried in the kscope-id header, which a
// kscope consumer downstream deduplicates on and which is a stable
// idempotency key for whatever the record asks done.
//
// # Order and visibility
//
// Rows are split into partitions by key hash. Within a partition a row's
// sequence number comes from a counter row that the inserting transaction
// holds locked until it ends, so sequence numbers are gapless and in
// commit order: a number is never visible before the ones below it. A
// relay that publishes "everything after the last sequence number" thus
// never skips a row whose transaction committed late (the hazard of an
// outbox keyed by an insert-time sequence), and the records of one key are
// published in the order their transactions committed. The price: two
// transactions adding to the same outbox partition serialize from the
// first Add to the commit; add outbox records late in a transaction.
//
// # The relay
//
// A [Relay] publishes each partition in Kafka transactions that carry the
// records and the partition's new position (the last sequence number,
// written to a compacted position topic), so a read_committed reader sees
// every record once across relay crashes, restarts and zombies. Partition
// p is published under the transactional id "<TransactionalID>-<p>": the
// instance that takes a partition over fences the one that had it and
// aborts its open transaction before reading the position. Instances share
// the partitions through a consumer group (or Options.OwnPartitions).
// Published rows are deleted once the position passes them, before
// Relay.Pending reports the new position; rows a relay stopped between its
// commit and their deletion left behind are deleted by the relay that takes
// the partition over. A relay wakes
// on LISTEN/NOTIFY when a writing transaction commits, and polls every
// Options.PollInterval besides.
//
// A partition whose position is past the last sequence number the database
// handed out (the outbox tables were recreated or restored from a backup,
// or the relay reads another database than its writers) is not published:
// publishing on would skip the rows numbered up to the position, and
// pruning would delete them unpublished. The relay logs an ERROR that says
// what to do every 30 seconds and counts the partition in Stats.Halted. The
// record identities of a recreated outbox repeat the old ones, which
// downstream inboxes take for duplicates: give a recreated outbox a new
// name.
//
// # Rows Kafka refuses
//
// A row that Kafka can never take would otherwise stop its partition for
// good, since the rows after it wait for it. The relay tells the row's
// fault from the topic's:
//
//   - A row Kafka refuses as a record (MESSAGE_TOO_LARGE: larger than the
//     producer's kgo.ProducerBatchMaxBytes or the topic's
//     max.message.bytes; RECORD_LIST_TOO_LARGE, INVALID_RECORD,
//     CORRUPT_MESSAGE, INVALID_TOPIC_EXCEPTION) is dead-lettered: moved to
//     the table <TablePrefix>outbox_dead with its identity, topic, key,
//     value, headers, the answer and when, and the partition goes on with
//     the rows after it. The broker refuses a whole record batch at once,
//     so a refusal names no row: the relay publishes fewer rows per
//     transaction until the row is refused alone, and the healthy rows
//     that shared its batch are published. A row is dead-lettered once it
//     was refused alone 3 times in a row; a row to a topic name Kafka does
//     not allow, at once. The row is written to the table before the
//     Kafka transaction that carries the position past it commits, so the
//     position passes only rows published or dead-lettered; after a
//     crash between the two, the relay that takes the partition over
//     finds the row in the table and moves the position past it without
//     sending it again (Kafka may take it by then: it would be published
//     while the table holds it as never published). Each is logged at
//     ERROR (at most one line every 30 seconds) and counted in
//     Stats.DeadLettered. The relay never prunes the table: an operator
//     lists its rows (kscope outbox dead list, or [DeadLetters.List]),
//     then requeues or discards each (see "Requeuing a dead row"). A
//     relay whose database lacks the table or the identity column
//     (Migrate not run since an upgrade) fails Run with a
//     dbscope.SchemaError that says to run Migrate.
//   - A row whose topic does not exist (the producer creates none unless
//     kgo.AllowAutoTopicCreation is in Options.ClientOptions), is refused
//     to the relay, or refuses the records' timestamps (the relay's clock)
//     is not at fault: it is published once that is fixed, and nothing
//     after it before. The rows before it are published; the partition is
//     counted in Stats.Stuck and logged at ERROR, with the topic and what
//     to do, every 30 seconds.
//
// [Writer] refuses at write time what it can tell the relay could not
// publish: a record larger than Writer.MaxRecordBytes (default
// DefaultMaxRecordBytes, the producer's and the broker's default limit),
// or to a topic name Kafka does not allow.
//
// # Requeuing a dead row
//
// "kscope outbox dead requeue ID" ([DeadLetters.Requeue]) moves a dead row
// back into its outbox; "kscope outbox dead discard ID"
// ([DeadLetters.Discard]) deletes it, never to be published. A requeue
// deletes the row from the dead-letter table and adds it at the end of its
// partition in one PostgreSQL transaction, numbered through the
// partition's sequence row as [Writer.Add] numbers rows: a crash leaves it
// in exactly one of the two tables, and the partition stays gapless and in
// commit order. The row keeps its identity: the outbox table's id column
// holds it, and the relay sends it in the kscope-id header instead of the
// identity of the row's new place, so a consumer that saw the record
// already drops the copy (a relay fenced between publishing a row and
// dead-lettering it can have done both). A requeued row that Kafka refuses
// again is dead-lettered again, under the same identity.
//
// The record is published after the records of its key added since it
// was written: per-key order is not restored. Before requeuing, check:
//
//   - that the cause is fixed: the topic's max.message.bytes (or the
//     brokers' message.max.bytes) and the relays' kgo.ProducerBatchMaxBytes
//     raised above the row's size, plus about a hundred bytes of framing
//     and the kscope-id header, and the relays restarted with it; a row to
//     a topic name Kafka does not allow is requeued to the topic it was
//     meant for (--topic);
//   - that its consumers can take the record late, after newer ones of its
//     key: one that checks per-key versions (package sequence) skips it as
//     stale once it applied a later version, and one that keeps the last
//     state of a key would go back to an older one. Discard the row instead,
//     and write what it should say anew with [Writer.Add], when that is so;
//   - that the relays run this version of kscope or a later one: an older
//     relay publishes a requeued row under the identity of its new place.
//
// Requeue the rows of one key in the order "kscope outbox dead list"
// shows them (the CLI does, for the rows it is given) to publish them in
// the order they were written.
//
// # Observability
//
// [Relay.Stats] counts published records, committed and aborted
// transactions, dead-lettered rows, and the partitions stuck or halted;
// [Relay.Pending] counts the committed rows not published yet, the age of
// the oldest, and the rows in the dead-letter table, for the partitions
// the relay publishes; [Status] (kscope outbox status) does for every
// partition. kscopeprom's Metrics.WatchRelay exports the stats and the
// backlog (kscope_outbox_*), with alert rules in
// examples/observability/alerts.yml. A [Writer] with
// Hooks (kscopeotel's tracer) writes the trace of Add's context into each
// record, so the consumer downstream continues the trace of the
// transaction that wrote the row.
//
// # What the outbox does not cover
//
// Readers must read with isolation.level=read_committed. A dead-lettered
// row is not published until an operator requeues it (the ERROR,
// Stats.DeadLettered and the alert say so), and the records of its key
// after it are published meanwhile: a consumer cannot tell that one is
// missing, and gets it after them once requeued. Keep records well within
// the size limits; Writer.MaxRecordBytes refuses the plainly oversized
// ones in the writing transaction.
//
// A commit that fails as the connection drops may have committed all the
// same: the outbox publishes what PostgreSQL committed, so a write path that
// retries such a transaction must first look up whether it committed (an
// idempotency key in the same transaction), or it publishes twice. A
// DB-scope handler needs nothing of this: its inbox row makes the
// redelivered record's transaction a no-op. Whatever a
// downstream consumer does outside its own exactly-once scope (an e-mail,
// a gateway call) needs the record's identity as its idempotency key.
package outbox

import (
	"context"

	"github.com/kscope-dev/kscope/dbscope"
)

// Migrate creates the outbox tables (with kscope's other tables; it is
// dbscope.Migrate): run it once per database and after every kscope
// upgrade, before writers and relays start.
func Migrate(ctx context.Context, db dbscope.Beginner, prefix string) error {
	return dbscope.Migrate(ctx, db, prefix)
}
