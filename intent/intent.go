// Package intent makes a DB-scope handler's call to an external provider
// (a payment gateway, an e-mail service) happen at most once per
// idempotency key, across crashes and redeliveries, without losing it.
//
// A handler in the DB scope runs in a PostgreSQL transaction, but its call
// to a provider does not: a crash after the call and before the commit
// redelivers the record, and calling again charges twice; not calling
// loses the charge. [Store.Do] closes that gap the way payment teams do
// ("record the intent, then reconcile"):
//
//  1. Before the call, it records the intent "in_flight" under the
//     idempotency key, in a transaction of its own that commits first.
//  2. It calls the provider; the answer is marked "done" in the handler's
//     transaction, so it commits with the handler's effects and inbox row.
//  3. A redelivery that finds the intent still "in_flight" (the process
//     died between the call and the commit, or the call failed) asks the
//     provider first, with the same key ([Reconcile]): if the provider has
//     an answer, it is used and nothing is called again; if not, the call
//     is made.
//
// The key should be stable per piece of work: the record's kscope identity
// (consumer.Identity), or a business id such as a payment intent. Pass the
// same key to the provider as its idempotency key (the Idempotency-Key
// header of most payment APIs), so a provider that deduplicates does so
// too.
//
// # What it does not cover
//
// Reconcile must be able to answer "did the call with this key take
// effect?": without a lookup by key at the provider, a crash between the
// call and the commit cannot be told apart from a call that never left. A
// call still running in another process (a network partition, not a
// crash) is outside what a row in PostgreSQL can see; the provider's own
// idempotency-key handling covers it. One Do per key per transaction.
package intent

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/dbscope"
)

// Call makes the external call for key and returns the provider's answer.
// It should pass key to the provider as its idempotency key.
type Call func(ctx context.Context, key string) (result []byte, err error)

// Reconcile asks the provider whether a call with key took effect: done
// reports that it did (or that the provider has a final answer for it,
// a decline say), with that answer; done false means the provider never
// saw the key, and the call is made.
type Reconcile func(ctx context.Context, key string) (result []byte, done bool, err error)

// Store keeps the intents in PostgreSQL, in the table <prefix>intents that
// dbscope.Migrate creates.
type Store struct {
	db  dbscope.Beginner
	sql struct{ begin, mark string }

	mu  sync.Mutex
	own map[string]*pgxpool.Pool // when db is nil: a pool per database the handlers' transactions are on
}

// New returns the Store of the intents table with prefix ("" selects
// dbscope.DefaultTablePrefix). db is where intents are recorded before a
// call, in a transaction of their own; nil (the usual choice) makes the
// Store open a small pool of its own for each database the handlers'
// transactions are on, with their connection settings (Close closes them).
//
// Do not pass the pool the DB scope runs its transactions on unless it has
// more connections than Config.Shards: every Do needs a second connection
// while the handler's transaction holds one, and a pool that every worker
// holds a connection of deadlocks.
func New(db dbscope.Beginner, prefix string) *Store {
	if prefix == "" {
		prefix = dbscope.DefaultTablePrefix
	}
	s := &Store{db: db}
	t := pgx.Identifier{prefix + "intents"}.Sanitize()
	s.sql.begin = `WITH ins AS (
		INSERT INTO ` + t + ` (key, state) VALUES ($1, 'in_flight') ON CONFLICT (key) DO NOTHING RETURNING key)
	SELECT EXISTS (SELECT 1 FROM ins), coalesce((SELECT state FROM ` + t + ` WHERE key = $1), ''), (SELECT result FROM ` + t + ` WHERE key = $1)`
	s.sql.mark = `UPDATE ` + t + ` SET state = 'done', result = $2, done_at = now() WHERE key = $1`
	return s
}

// Outcome says how [Store.Do] got its answer.
type Outcome int

const (
	// Called: the provider was called (first time, or reconcile found
	// nothing).
	Called Outcome = iota
	// Reconciled: an earlier attempt's call had taken effect; the
	// provider's answer came from Reconcile and nothing was called.
	Reconciled
	// Recorded: the intent was done already (a transaction that
	// committed); its answer came from the table.
	Recorded
)

// ErrNoReconcile is returned by [Store.Do] when an intent is in flight
// and no Reconcile function was given: calling again could repeat the
// effect.
var ErrNoReconcile = errors.New("intent: an earlier attempt of this call may have taken effect and no Reconcile was given to ask the provider; pass one")

// Do returns the provider's answer for key, calling it at most once
// across attempts: it records the intent before calling (committed at
// once, outside tx), calls, and marks the intent done in tx, the handler's
// transaction. When an earlier attempt left the intent in flight, it asks
// reconcile before calling. An error from call or reconcile is returned as
// is (the handler returns it; the failure policy retries the record and
// the next attempt reconciles first).
func (s *Store) Do(ctx context.Context, tx pgx.Tx, key string, call Call, reconcile Reconcile) ([]byte, Outcome, error) {
	if key == "" {
		return nil, Called, errors.New("intent: the key is empty; pass a stable idempotency key (the record's identity, a payment id)")
	}
	var fresh bool
	var state string
	var result []byte
	db, err := s.beginner(ctx, tx)
	if err != nil {
		return nil, Called, err
	}
	err = pgx.BeginFunc(ctx, db, func(itx pgx.Tx) error {
		return itx.QueryRow(ctx, s.sql.begin, key).Scan(&fresh, &state, &result)
	})
	if err != nil {
		return nil, Called, fmt.Errorf("intent: recording the intent of %q: %w", key, err)
	}
	if !fresh && state == "done" {
		return result, Recorded, nil
	}
	if !fresh {
		if reconcile == nil {
			return nil, Called, ErrNoReconcile
		}
		res, done, err := reconcile(ctx, key)
		if err != nil {
			return nil, Reconciled, err
		}
		if done {
			return res, Reconciled, s.mark(ctx, tx, key, res)
		}
	}
	res, err := call(ctx, key)
	if err != nil {
		return nil, Called, err
	}
	return res, Called, s.mark(ctx, tx, key, res)
}

func (s *Store) mark(ctx context.Context, tx pgx.Tx, key string, res []byte) error {
	tag, err := tx.Exec(ctx, s.sql.mark, key, res)
	if err != nil {
		return fmt.Errorf("intent: marking %q done: %w", key, err)
	}
	if tag.RowsAffected() == 0 {
		// The intent was recorded elsewhere: marking it here would leave
		// it in flight there for ever.
		return fmt.Errorf("intent: the intent of %q is not in the database of the handler's transaction; give New the pool of that database (or nil)", key)
	}
	return nil
}

// beginner returns where intents are recorded: db, or the Store's own
// pool on the database of tx.
func (s *Store) beginner(ctx context.Context, tx pgx.Tx) (dbscope.Beginner, error) {
	if s.db != nil {
		return s.db, nil
	}
	conn := tx.Conn().Config().ConnString()
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.own[conn]; p != nil {
		return p, nil
	}
	cfg, err := pgxpool.ParseConfig(conn)
	if err != nil {
		return nil, fmt.Errorf("intent: opening a connection for intents: %w", err)
	}
	cfg.MaxConns = 4
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("intent: opening a connection for intents: %w", err)
	}
	if s.own == nil {
		s.own = map[string]*pgxpool.Pool{}
	}
	s.own[conn] = p
	return p, nil
}

// Close closes the pools the Store opened for itself, if any.
func (s *Store) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, p := range s.own {
		p.Close()
		delete(s.own, k)
	}
}
