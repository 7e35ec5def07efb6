// Package partition routes the records of a consumer group member's assigned
// partitions to serial key-shard workers.
//
// Every record is mapped to one of N shards by [Shard]: records with the same
// topic and key always map to the same shard, so they are handled by one
// worker, one at a time, in the order they were dispatched (offset order
// within a partition). Records with different keys spread over the shards and
// run in parallel. Records with a null key are, by default, ordered per
// partition: every null-key record of a partition goes to one shard.
//
// A [Pool] owns the shard workers. Each shard has an unbounded queue, so
// dispatching never blocks the poll loop; the caller bounds what is in flight
// (the consumer pauses fetching past its bound). Queued records of a partition
// that is revoked can be purged before they start, and a stopped pool drops
// what it has not started, so that revocation and shutdown wait only for work
// that is already running.
//
// A worker hands its [ProcessFunc] batches of one partition's records, up to
// PoolConfig.BatchMax: the queued records of the partition at the head of its
// queue, gathered past other partitions' records queued between them (each
// poll queues a run per partition), each partition's records in the order
// dispatched. A scope that pays a cost per batch (a database transaction)
// pays it once for what several polls queued.
package partition
