// Package dbscope is kscope's DB scope: effectively-once processing into
// PostgreSQL.
//
// Each record's handler runs inside a pgx transaction that also inserts the
// record's inbox row, (consumer, message id). A record whose row already
// exists has had its effect applied: it is skipped without calling the
// handler and counted as a duplicate. A batch of first deliveries inserts
// its rows with a plain INSERT, which the inbox's primary key checks as it
// inserts; when an id is there already, that insert fails before any
// handler runs, and the transaction is opened again with ON CONFLICT DO
// NOTHING, which skips the ids already there (and is used for every batch
// for ten seconds after). The two give the same outcome; the plain insert
// costs PostgreSQL less for each row. The transaction
// commits, and only then is the record reported done, so the Kafka offset
// is committed strictly after the transaction that holds the inbox row. A
// crash, a rebalance, a producer retry or a replay from the start of the
// topic therefore never applies a record's database effect twice.
//
// A record's identity comes from consumer.Config.Identity: kscope's own identity
// header (carried by retry and dead-letter hops), a producer-set
// "message-id" header, an extractor, or the record's original
// topic/partition/offset.
//
// A handler error is classified by consumer.Config.Failures: a business
// skip (consumer.Skip) commits what the handler wrote and acknowledges the
// record; a failure rolls the record back to its savepoint, and it is
// retried in place or, once its budget is spent or when it is poison, sent
// to the dead-letter topic, and only then acknowledged. A handler that
// goes on after a failed statement (the transaction is then aborted) has
// its writes rolled back: a nil becomes a failure, a skip stays a skip
// without its writes. Only errors from PostgreSQL or the connection (see
// IsTransient) retry the transaction instead, and only when the handler did
// not mark them with a class.
//
// # Errors that say the deployment is wrong
//
// A statement that fails because the deployment is wrong, not the record —
// a table or column the service's migration has not created, a privilege
// not granted — fails every record alike. Such an error
// ([IsDeploymentError]: SQLSTATE class 42, syntax error or access rule
// violation, among them 42P01 undefined_table, 42703 undefined_column,
// 42501 insufficient_privilege; class 28, invalid authorization; 3D000,
// the database does not exist; class 3F, invalid schema name) holds the
// key-shard that meets it: no record is routed to a retry topic or the
// dead-letter topic for it, no offset is committed past it, and the
// transaction is retried with a backoff that grows to 30 s until the
// statement succeeds; then every held record is applied, once and in
// order. The runner logs one ERROR when the hold begins and one INFO when
// it ends, and exports it in Stats().Hold and through hook.HoldHook
// (kscope_held_key_shards{reason="deployment"} in kscopeprom).
//
// A handler whose SQL depends on the record (a table per tenant named by
// the record) makes such an error the record's fault again: mark it with a
// class (consumer.Terminal(err)), or classify its code in
// consumer.Config.Failures.Classify (any class, unknown included, with
// ok=true): it then follows the failure policy.
//
// Records of one key-shard are batched into one transaction
// (Options.BatchSize; up to 64 for a Handler), each record's writes after a
// savepoint of its own, so that a failing record rolls back alone and the
// others commit without their handlers running again ([Handler] says
// exactly when a handler runs twice). Options.StoreOffsets also keeps the
// consumed position in the same transaction, which removes the duplicate
// window after a crash entirely; a position is used only under the routing
// of records to key-shards it was written under.
//
// Run [Migrate] before the runner: Run checks kscope's tables at start and
// fails with a [*SchemaError] that says to run it.
//
// # A database that is down or refuses the runner
//
// At start, before it joins the group, Run checks its database. When
// PostgreSQL refuses the runner (a wrong user or password, SQLSTATE class
// 28; a database that does not exist, 3D000; a missing privilege, 42501;
// any error of [IsDeploymentError]), Run fails at once with a
// [*DatabaseError] that names the address, the database, the user and the
// setting to change. A database that does not answer (a refused
// connection, a timeout, a server starting up) is retried with a backoff
// that grows to 30 s, each attempt logged at WARN; meanwhile the runner's
// Stats().Waiting says what it waits for (a readiness probe reports it),
// and after Options.StartTimeout (default 1 minute) Run fails with a
// *DatabaseError whose TimedOut is set.
//
// A handler whose effect is statements that need no result can queue them
// instead ([NewQueued], [QueueHandler]): the statements of a whole batch
// then reach PostgreSQL in one pipelined round trip.
//
// Options.Versions turns on version-gap detection (package sequence): the
// last applied version per key lives in PostgreSQL and is read with a row
// lock, checked and advanced in the record's transaction.
//
// # What the DB scope does not cover
//
// Only what the handler does through the transaction it is given is applied
// exactly once. An HTTP call, an email, a message produced to Kafka from
// inside the handler is at-least-once: it can happen again when the
// transaction rolls back and the record is retried. Give such calls an
// idempotency key — the record's identity is a natural one — or move them
// behind an outbox table written in the same transaction.
package dbscope
