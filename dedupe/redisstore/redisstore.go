// Package redisstore is a dedupe.Store in Redis (github.com/redis/go-redis/v9):
// one key per remembered identity, Options.Prefix followed by the
// identity, whose expiry is the window. Redis forgets an identity when its
// window passes, so the store needs no cleanup, and every member of a
// group (and every service sharing the server and prefix) sees what the
// others remembered.
//
// Each call is one round trip, whatever the number of identities: Seen a
// pipeline of EXISTS, Remember a pipeline of SET key 1 PX ttl, Forget a
// pipeline of DEL. Pipelines of single-key commands, rather than one MGET
// or one DEL of many keys, work the same on a Redis Cluster, where a
// command over keys of several hash slots is refused (the cluster client
// sends each node its part of the pipeline). A remembered identity costs
// Redis about 90 bytes plus the key's length (prefix and identity).
//
// When Redis is unreachable a call returns its error after the client's
// retries: with go-redis's defaults (MaxRetries 3 with backoff, five
// dials 100ms apart) several seconds per call, during which the record
// waits. Set the client's DialTimeout, ReadTimeout, MaxRetries and
// DialerRetries to the wait a record may spend on the store.
//
// # Why SET and not SET NX
//
// SET NX (set if absent) would make "seen" and "remember" one atomic step,
// a claim taken before the handler runs. The guard records an identity
// only after its handler succeeded, so that a record that fails, or whose
// handler never finishes because the process dies, leaves no mark and a
// later delivery runs it again: a claim taken before the handler would
// have to be deleted on every failure, and one left by a crash would make
// the redelivery a "duplicate" of work that never happened, until its
// expiry. SET NX would also leave the first window in place when an
// identity is remembered again, where the guard extends it. Plain SET with
// an expiry is idempotent: two members remembering the same identity (a
// duplicate handled by both before either remembered it, which the guard
// does not exclude) simply leave one key with the later window. What NX
// would have given, excluding that two members run the same identity at
// once, the guard does not promise; per-key order in one group already
// makes it rare (see docs/dedupe.md).
package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kscope-dev/kscope/dedupe"
)

// DefaultPrefix is the prefix of the store's keys by default.
const DefaultPrefix = "kscope:dedupe:"

// Options configure a Store.
type Options struct {
	// Prefix starts every key of the store. "" selects DefaultPrefix.
	// Groups may share a prefix: the runner puts its consumer group
	// before each identity (consumer.DedupeConfig). A prefix with a
	// hash tag ("kscope:{shipping}:") keeps every key in one slot of a
	// Redis Cluster.
	Prefix string
}

// Store is a dedupe.Store in Redis. It is safe for concurrent use.
type Store struct {
	c      redis.UniversalClient
	prefix string
}

var _ dedupe.Store = (*Store)(nil)

// New returns a Store on c (a *redis.Client, *redis.ClusterClient,
// *redis.Ring or failover client). The client's own timeouts and retries
// bound each call; a call that fails returns the error, and the runner
// decides from consumer.DedupeConfig what to do.
func New(c redis.UniversalClient, o Options) *Store {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	return &Store{c: c, prefix: o.Prefix}
}

// Seen implements dedupe.Store: one pipeline of EXISTS. Redis answers for
// a key whose expiry has passed that it does not exist.
func (s *Store) Seen(ctx context.Context, ids []string) ([]bool, error) {
	out := make([]bool, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	cmds := make([]*redis.IntCmd, len(ids))
	_, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.Exists(ctx, s.prefix+id)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i, c := range cmds {
		out[i] = c.Val() > 0
	}
	return out, nil
}

// Remember implements dedupe.Store: one pipeline of SET key 1 PX ttl. The
// ttl must be positive; Redis keeps it to the millisecond (rounded up).
func (s *Store) Remember(ctx context.Context, ids []string, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("redisstore: Remember's ttl is %s: it must be positive", ttl)
	}
	if len(ids) == 0 {
		return nil
	}
	ttl = (ttl + time.Millisecond - 1).Truncate(time.Millisecond)
	_, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			p.SetArgs(ctx, s.prefix+id, "1", redis.SetArgs{TTL: ttl})
		}
		return nil
	})
	return err
}

// Forget implements dedupe.Store: one pipeline of DEL.
func (s *Store) Forget(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			p.Del(ctx, s.prefix+id)
		}
		return nil
	})
	return err
}
