// Package dedupe is the idempotency guard's memory for the AtLeastOnce
// scope (consumer.Config.Dedupe): a [Store] remembers, for a window, the
// identities of the records whose handler succeeded, so that an upstream
// duplicate (a producer's retry, a relay that sends again, a replay) or a
// redelivery after a crash is skipped instead of handled twice.
//
// The guard's rules, which every store serves:
//
//   - An identity is the one the runner derives (consumer.Identity: the
//     kscope-id header, the producer's message-id header, an extractor,
//     or the record's coordinates).
//   - A record whose identity is remembered is not handled: it is done,
//     its offset committed, and counted as a duplicate.
//   - An identity is remembered only after the record's handler returned
//     nil, and before its offset may commit. A record that failed (retried,
//     sent to a retry topic or the dead-letter topic, skipped) leaves no
//     mark: a later delivery runs it again.
//   - An identity is forgotten after the window (Store.Remember's ttl), or
//     by Forget (an operator's replay).
//
// The stores: [Memory] (bounded, in the process: tests and single-instance
// services), [Postgres] (a table with an index on expiry, cleaned in
// batches), and package dedupe/redisstore (Redis, a key per identity with
// an expiry). Package dedupe/dedupetest checks a store of one's own
// against these rules. The DB scope needs none (its inbox is its guard)
// and the Kafka scope keeps its own in its transactions
// (txn.Options.Dedupe).
package dedupe

import (
	"context"
	"time"
)

// Store remembers identities for a window. Its methods take several
// identities at once, so that a batch of records costs one round trip.
// They are called concurrently, from several key-shards; an error means
// the store could not answer (consumer.DedupeConfig.Unavailable decides
// what the runner does then).
type Store interface {
	// Seen reports, for each of ids, whether it is remembered and its
	// window has not passed. The result has len(ids) entries.
	Seen(ctx context.Context, ids []string) ([]bool, error)
	// Remember remembers ids until ttl from now. Remembering an id again
	// extends its window.
	Remember(ctx context.Context, ids []string, ttl time.Duration) error
	// Forget forgets ids: a later record with one of them is handled.
	Forget(ctx context.Context, ids []string) error
}

// Cleaner is a Store that removes the identities whose window has passed
// when asked, rather than on its own: [Postgres] deletes their rows,
// [Memory] frees their entries. The runner calls Cleanup every
// consumer.DedupeConfig.CleanupInterval; a Store whose server expires
// identities itself (Redis) does not implement it.
type Cleaner interface {
	// Cleanup removes expired identities and returns how many it removed.
	// An error leaves the rest for the next call: expired identities are
	// never seen, removed or not.
	Cleanup(ctx context.Context) (int64, error)
}
