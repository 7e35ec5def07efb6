// Package scope is the contract between kscope's runner and a unit of
// work: the interfaces a scope implements to plug into the runner, and
// what the runner gives a scope in return. It is to package consumer what
// database/sql/driver is to database/sql. kscope's own scopes are built on
// it and on nothing else of the runner: the AtLeastOnce scope
// (consumer.New), the DB scope (package dbscope) and the Kafka scope
// (package txn). A service that keeps its effects in another store writes
// its scope on it too, and runs it with consumer.NewScoped
// (examples/boltscope is one, for a bbolt file).
//
// The type parameter R is always *consumer.Record and S consumer.Stats:
// they are parameters only so that this package sits below package
// consumer, which implements the runner, and every interface is defined
// once and checked by the compiler on both sides.
//
// # What the runner does
//
// The runner is kscope's one engine: it owns polling, key-shard dispatch
// (one serial worker per key-shard: a key's records reach its scope in
// offset order, one batch at a time), the in-flight bound, holding
// not-yet-due retry records, the retry loop ([Failures].Rounds), the
// commit watermark, lag, stats and shutdown, for every scope.
//
// # What a scope does
//
// A scope turns the records of one key-shard into durable effects
// ([Scope].Process) and says so, record by record, with done. The runner
// commits a partition's offset only up to its lowest record not done,
// every consumer.Config.CommitInterval, or, for a [Transactor], in the
// Kafka transaction that carries the records' outputs. The duties, each
// stated once, on the interface it belongs to:
//
//   - when to call done, and when Process may return: [Scope];
//   - what a failing record becomes (a retry in place, a retry topic, the
//     dead-letter topic, a skip): [Failures], reached through [Engine];
//   - what a scope that commits the offsets itself, in Kafka transactions,
//     does instead of the runner's commits, and what the runner does for it:
//     [Transactor] and [TxnEngine].
//
// The optional interfaces ([Batcher], [Background], [Delayer], [Starter],
// [ClientOptioner], [StatsReporter], [EngineUser], [RetryTopicUser],
// [Periodic], [Transactor]) are found by a type assertion on the scope
// when the runner is built, as database/sql finds a driver's optional
// interfaces; a scope declares the ones it means to implement with a
// compile-time assertion, so that a changed signature is a compile error:
//
//	var (
//		_ scope.Scope[*consumer.Record]      = (*myScope)(nil)
//		_ scope.EngineUser[*consumer.Record] = (*myScope)(nil)
//	)
package scope
