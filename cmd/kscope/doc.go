// Command kscope inspects and repairs what kscope consumers leave in Kafka
// and what an outbox relay leaves in PostgreSQL: it lists, shows and
// redrives, skips and deletes the records of a consumer group's
// dead-letter topic, moves a
// stopped group's committed offsets to replay (or skip) records, shows a
// share group's members and backlog and moves its start offsets, shows
// how far an outbox's relay is, lists, shows, requeues and discards the
// outbox rows Kafka refused, checks a service's policy file, and runs a
// local broker and a throwaway PostgreSQL for development.
//
// Build it with:
//
//	go build -o bin/kscope ./cmd/kscope
//
// # Usage
//
//	kscope dlt list    (--topic T | --group G) [filters] [--json]
//	kscope dlt show    (--topic T | --group G) --partition P --offset O [--max-value N] [--json]
//	kscope dlt redrive (--topic T | --group G) --to source|retry [filters] [--dry-run] [--rate N] [--by WHO]
//	kscope dlt redrive (--topic T | --group G) --to source|retry --partition P --offset O --payload-file F --reason R [--approve NAME]
//	kscope dlt skip    --group G (--partition P --offset O | --key K | --id ID) --reason R [--approve NAME] [--scope S] [--database-url URL]
//	                   [--dedupe postgres|redis] [--redis-url URL]
//	kscope dlt delete  (--topic T | --group G) --partition P --before-offset O --approve NAME --reason R [--yes]
//	kscope replay      --group G --topic T (--to-offset N | --to-time RFC3339 | --to-start | --to-end) [--dry-run] [--yes]
//	                   [--approve NAME] [--force --reason R] [--max-scan N] [--database-url URL] [--audit-topic T]
//	kscope audit       [--group G] [--audit-topic T] [--json]
//	kscope share describe --group G [--json]
//	kscope share reset    --group G --topic T (--to-start | --to-end | --to-offset N [--partition P] | --to-time RFC3339) [--dry-run] [--yes]
//	                      [--approve NAME] [--force --reason R] [--max-scan N] [--database-url URL] [--audit-topic T]
//	kscope outbox status         [--outbox NAME] [--partitions N] [--database-url URL] [--json]
//	kscope outbox dead list      [--outbox NAME] [--database-url URL] [--json]
//	kscope outbox dead show      ID [--max-value N] [--json]
//	kscope outbox dead requeue   (ID... | --all [--outbox NAME]) [--topic T] [--dry-run] [--yes] [--json]
//	kscope outbox dead discard   (ID... | --all [--outbox NAME]) [--dry-run] [--yes] [--json]
//	kscope policy check [FILE]
//	kscope policy schema
//	kscope dev         [--port 9092] [--data-dir DIR] [--partitions N] [--nodes N] [--postgres auto|on|off] [--pg-port N] [--pg-bin DIR]
//	kscope help [command]
//
// The commands that talk to Kafka take --brokers, a comma-separated list
// of seed brokers, which defaults to $KAFKA_BROKERS; the outbox commands
// take --database-url, which defaults to $DATABASE_URL, and
// --table-prefix, the prefix dbscope.Migrate was given. With --group, the dead-letter topic is
// "<group>.kscope-dlt" (retrytopic.DLTopic). The filters of dlt list and dlt
// redrive are --partition, --from-offset and --to-offset (inclusive),
// --key (exact), --class (unknown, retryable, terminal, skip) and --id (the
// kscope identity). "kscope <command> -h" prints a command's flags and
// examples.
//
// # The policy file
//
// Every command takes --policy FILE, before or after its name, which
// defaults to $KSCOPE_POLICY: the service's policy file (package policy),
// one entry per consumer group with its scope, owner, failure policy,
// dead-letter topic, whether a replay is allowed, lag objective and gap
// policy. policy check validates a file (FILE, or the one --policy names)
// as policy.Load does and lists its entries, or prints every problem, each
// with its file, line, consumer group, field and fix, and exits 2. policy
// schema prints the file's JSON Schema. replay refuses a group whose
// entry says replay: false, before it talks to Kafka, with exit status 2
// and a sentence that names the policy and the owner; a policy file that
// is not valid stops it the same way. dlt list and dlt show print a dead
// letter's owner from its kscope-owner header, else the file's owner of
// its group, marked "(policy)".
//
// dlt redrive --group G commits the offsets past the dead letters it
// handled, in offset order, under the consumer group G.kscope-triage;
// dlt list --group G ends with how many wait past them, the count the
// gauge kscope_dead_letters_waiting (kscopeprom.Metrics.WatchDeadLetters)
// exports.
//
// Beyond redrive, three triage actions each write a record to the audit
// log before they act, and commit the triage group past the dead letters
// they handled when those are next in line. dlt redrive --payload-file
// sends one dead letter with an edited value, and the audit record keeps
// both values. dlt skip gives dead letters up with a reason and marks
// their identities resolved: the DB scope's inbox rows get the status
// resolved, which the scope treats as done even when redriven; an
// at_least_once group's dedupe store (Postgres or Redis) remembers them
// under the runner's key; the Kafka scope has no such state, so a replay
// handles them again there. Every later dlt redrive passes over a skipped
// identity. dlt delete deletes a partition's prefix (Kafka's
// DeleteRecords), refused without --approve, listing the identities it
// deletes (never their values) in the audit record.
//
// # Timeouts
//
// Every command that talks to Kafka or PostgreSQL takes two timeouts.
// --connect-timeout (default 10s) bounds a connection: the TCP connection
// to a broker, and the connection and start-up (TLS, authentication) of a
// PostgreSQL session; it overrides the connect_timeout of the database
// URL. --request-timeout (default 15s) bounds each step of the command
// that waits for a server: looking up a topic, listing its offsets,
// describing a group, committing offsets, one database query or
// transaction (for outbox status, the whole read of the positions and the
// counts), retries included. A server that takes connections and never
// answers (a hung server, a port something else listens on) fails the
// command once the timeout passed, with an error that names its address
// and the flag to raise: "no answer from the brokers 10.0.0.5:9092 within
// --request-timeout 15s", "PostgreSQL at 10.0.0.7:5432 did not answer
// within --request-timeout 15s". Reading records (dlt list, show and
// redrive) is bounded by --idle-timeout instead, and a produce by the
// redrive's delivery timeout (30s per record).
//
// # Reading a dead-letter topic
//
// dlt list and dlt show read with read-committed isolation and no consumer
// group (nothing is committed), from the start of each partition up to the
// end offset seen when the command starts: they never wait for records
// produced after that. Records that a transaction still open holds back
// (past the last stable offset) are named as not read, and records deleted
// by retention after the read began and before it reached them fail the
// read, named, rather than being passed over. They decode each record's kscope headers (attempt,
// error class and message, failure times, original topic, partition and
// offset) with retrytopic.FromRecord.
//
// # Redrive
//
// dlt redrive re-publishes matching records to their original topic
// (--to source) or to the group's first retry topic (--to retry, with
// --ladder-first, default retrytopic.DefaultLadder[0]). Every consumer
// group on the original topic reads what --to source sends: a DB-scope
// group that applied the record dedupes it, a group in another scope
// handles it again; --to retry reaches the group alone. A redriven record
// keeps its key, value and headers, including its identity (kscope-id) and
// original coordinates, so a record that was already applied dedupes as a
// no-op downstream; an identity dead-lettered twice is sent once. It loses the per-attempt routing headers (attempt, due,
// stage, parked, error, error class, failure times and Spring's
// kafka_dlt-* headers), so it gets a fresh retry budget, and gains an audit
// header, kscope-redrive: "by=<who> at=<RFC 3339 UTC> from=<topic>/<partition>/<offset>".
// A keyed record is partitioned by its key as the Java client does; a
// record without a key goes back to its original partition.
//
// Redrive does not remove records from the dead-letter topic: Kafka cannot
// delete single records. Partitions are redriven one after the other, in
// offset order; records are produced synchronously, one at a time, at most
// --rate per second. The first error (a produce, or records deleted by
// retention before the redrive reached them) stops the redrive and names
// the partition and offset to resume from; records held back by an open
// transaction are named with the offset to resume from once it ends, and
// the redrive exits 1. --dry-run prints what would be sent and sends
// nothing.
//
// # Replay
//
// replay moves the committed offsets of a stopped consumer group on one
// topic. It first prints the blast radius: per partition, the committed
// offset, the target offset and the number of records that will be
// consumed again (moving back) or skipped (moving forward); for a move
// back, the records it gives again read from the topic (at most --max-scan):
// their count, distinct keys and time range, and for a DB-scope consumer
// with --database-url the expected no-op rate, the share already in its
// inbox. It commits only with --yes, and refuses when the group does not
// exist, still has members, or the topic does not exist; with a policy
// file, also an at_least_once consumer without a lasting dedupe store
// (unless --force --reason) and a critical consumer without --approve.
// Every commit is first appended to the audit log, the compacted topic
// kscope-audit, which audit lists.
//
// # Share groups
//
// share describe shows a share group (consumer.Config.Share): its state,
// its members (member id, client id, host, assigned partitions) and, per
// partition, the share-partition start offset, the end offset and the
// backlog between them (records not yet acknowledged, those in flight
// included), with the broker's lag when it reports it. The broker reports
// neither the records in flight nor their delivery counts, and the
// command says so; a member's runner counts them (consumer.Stats().Share,
// kscopeprom.Metrics.WatchShare).
//
// share reset moves a share group's start offsets on one topic (all its
// partitions, or --partition P): back, its members are given the records
// from there again; forward, the records below are archived. It follows
// replay's rules: the blast radius first, --yes to move, the policy
// file's replay: false, at_least_once without a lasting dedupe store and
// critical: true refusals, and an audit log entry (action share-reset)
// before the move. Kafka moves the start offsets of a share group only
// while it has no members: share reset refuses one that has (exit status
// 2), and one that does not exist.
//
// # The outbox's dead rows
//
// An outbox relay moves a row Kafka refuses for good (too large for the
// relay's producer or the topic, a record the broker rejects, a topic name
// Kafka does not allow) to the table <prefix>outbox_dead, so that the rows
// after it are published. outbox dead list and show print those rows
// (identity "<outbox>/<partition>/<seq>", topic, key, size, when, Kafka's
// answer; show adds the headers and the value), and outbox status counts
// them per partition. They change nothing. outbox status also lists, as
// "no relay", partitions outside the outbox's that hold rows: a Writer
// with another Partitions wrote them, and no relay publishes them. On an
// outbox whose relay never ran (its position topic does not exist, which
// is also what a wrong --outbox or --position-topic looks like), it counts
// every row as pending and says that no relay has run yet.
//
// outbox dead requeue moves rows back into their outbox, each in one
// PostgreSQL transaction that deletes it from the dead-letter table and
// adds it at the end of its partition through the partition's sequence
// row, so it is in exactly one of the two tables whatever happens. The
// relay publishes it with its original identity in the kscope-id header,
// so a consumer that saw it already drops the copy; it comes after the
// records of its key written since (per-key order is not restored). Rows
// are requeued in the order the list shows them. A row to a topic name
// Kafka does not allow is skipped unless --topic names the one it was
// meant for. outbox dead discard deletes rows, never to be published.
// Both print the rows first and change them only with --yes (never with
// --dry-run); an identity that is not in the table is named, and makes
// the command exit 1.
//
// # A local broker and database
//
// dev runs franz-go's kfake, an in-process Kafka-protocol broker, and a
// throwaway PostgreSQL server started from the machine's PostgreSQL server
// binaries (initdb, pg_ctl), until interrupted, and prints the
// KAFKA_BROKERS and DATABASE_URL to export. The server listens on
// 127.0.0.1 (--pg-port, a free port by default) with a superuser "kscope"
// and no password, runs as the postgres user when kscope runs as root, and
// is removed with its data when dev stops, also when it is killed. With
// --postgres auto (the default), a machine without the binaries gets the
// broker alone and a note on how to install them (Debian, Ubuntu:
// apt-get install postgresql); --postgres on fails without them, and
// --postgres off starts the broker alone. --data-dir keeps the broker's
// data across restarts; the PostgreSQL server is always throwaway.
//
// # Exit codes
//
// 0: done. 1: the command failed or refused; the message says what to fix.
// 2: the command line is wrong (including no brokers given), or the policy
// file is not valid or forbids what was asked; nothing was done.
package main
