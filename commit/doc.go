// Package commit tracks, per partition, which consumed offsets are durable and
// computes the offset that is safe to commit to Kafka.
//
// Records of one partition are handed to several key-shard workers and finish
// out of order. A [Tracker] holds, for each assigned partition, the offsets
// that were dispatched and not yet finished; the committable offset of a
// partition is the lowest offset that is not finished (or one past the last
// finished offset when nothing is outstanding). The committed offset therefore
// never passes a record whose effect is not yet durable, whatever order the
// workers finish in.
//
// A partition's state is an epoch-scoped [Partition] value: when a partition is
// revoked and later assigned again, the new assignment gets a new Partition,
// and a late completion reported against the old one (a zombie worker that
// outlived the drain timeout) changes nothing.
package commit
