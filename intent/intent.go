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
//  1. Before the call, it takes the key's lock in the handler's
//     transaction and records the intent "in_flight" under the key, in a
//     transaction of its own that commits first.
//  2. It calls the provider; the answer is marked "done" in the handler's
//     transaction, so it commits with the handler's effects and inbox row.
//  3. A redelivery that finds the intent still "in_flight" (the process
//     died between the call and the commit, or the call failed) asks the
//     provider first, with the same key ([Reconcile]): if the provider has
//     an answer, it is used and nothing is called again; if not, the call
//     is made.
//
// The intent's attempts column counts the attempts that reached the
// provider (the first call, then each reconcile), committed before each
// one, so a key that keeps failing shows how often it was tried; an
// attempt that took a recorded answer, or got [ErrBusy], is not counted.
//
// The lock is held until the handler's transaction ends, so another
// attempt of the key — a second record of one payment on another shard,
// or a partition's old owner still calling after a rebalance gave its
// records to a new one — neither calls nor reconciles while a call may be
// under way: it gets [ErrBusy], and once retried takes the recorded answer
// (or reconciles, if that transaction rolled back). A crashed process's
// lock goes with its connection. A second Do of a key in the transaction
// that holds it (two records of one payment in one batch) returns the
// first's answer.
//
// The key should be stable per piece of work: the record's kscope identity
// (consumer.Identity), or a business id such as a payment intent. Pass the
// same key to the provider as its idempotency key (the Idempotency-Key
// header of most payment APIs), so a provider that deduplicates does so
// too.
//
// Intents are kept: kscope never deletes a row of the intents table. A
// done row is what makes a replay, or a record back from a retry topic
// hours later, take the recorded answer instead of calling again. Delete
// done rows only once no record carrying their key can be delivered again
// (past the topics' retention and the retry ladder), and never an
// in_flight one: its next attempt would call without reconciling.
//
// # What it does not cover
//
// Reconcile must be able to answer "did the call with this key take
// effect?": without a lookup by key at the provider, a crash between the
// call and the commit cannot be told apart from a call that never left.
// The lock lives with the handler's transaction's connection: a call that
// outlives it (the connection dropped, or idle_in_transaction_session_timeout
// ended it, while the provider was slow) or a request its caller gave up
// on (a client timeout) that still lands at the provider after the next
// attempt's Reconcile looked is outside what PostgreSQL can see; the
// provider's own idempotency-key handling covers those. Do does not see
// the request: a key reused for a different request (another amount under
// the same payment id) gets the first request's answer, where a payment
// API would refuse it; make the key name exactly one request.
package intent

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
)

// Call makes the external call for key and returns the provider's answer.
// It should pass key to the provider as its idempotency key.
type Call func(ctx context.Context, key string) (result []byte, err error)

// Reconcile asks the provider whether a call with key took effect: done
// reports that it did (or that the provider has a final answer for it,
// a decline say), with that answer; done false means the provider never
// saw the key, and the call is made. A provider that saw the key but has
// no final answer yet (a charge still processing) is neither: return an
// error, and the record is retried, to ask again.
type Reconcile func(ctx context.Context, key string) (result []byte, done bool, err error)

// Store keeps the intents in PostgreSQL, in the table <prefix>intents that
// dbscope.Migrate creates.
type Store struct {
	db  dbscope.Beginner
	sql struct{ lock, read, record, mark string }
	// class is the first half of the keys' advisory locks: one per
	// intents table.
	class int32

	mu  sync.Mutex
	own map[string]*pgxpool.Pool // when db is nil: a pool per database the handlers' transactions are on
}

// New returns the Store of the intents table with prefix ("" selects
// dbscope.DefaultTablePrefix). db is where intents are recorded before a
// call, in a transaction of their own; nil (the usual choice) makes the
// Store open a small pool of its own for each database the handlers'
// transactions are on, with their connection settings (Close closes them).
// Those are the settings of the handler's connection: credentials that a
// pool hook supplies anew for each connection (pgxpool.Config.BeforeConnect,
// an IAM token) are not renewed there; pass a pool of your own then.
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
	s.class = hash32("kscope intents " + t)
	s.sql.lock = `SELECT pg_try_advisory_xact_lock($1, $2)`
	s.sql.read = `SELECT state, result FROM ` + t + ` WHERE key = $1`
	// An attempt that finds the intent in flight counts itself in
	// attempts as it records it; the statement returns no row for an
	// intent done already (one tx cannot see), and 1 for a new one.
	s.sql.record = `INSERT INTO ` + t + ` AS i (key, state) VALUES ($1, 'in_flight')
		ON CONFLICT (key) DO UPDATE SET attempts = i.attempts + 1 WHERE i.state = 'in_flight' RETURNING attempts`
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

// ErrBusy is returned by [Store.Do] when another transaction holds the
// key: an attempt of the same call is under way in another worker or
// process (a second record of one payment, a partition's old owner still
// finishing after a rebalance). Nothing was called and the provider was
// not asked, since it may not have an answer yet. Do returns it marked
// consumer.Retryable, so a handler that returns it as it is gets the
// record retried: once that transaction ends, the next attempt takes its
// recorded answer, or reconciles if it rolled back.
var ErrBusy = errors.New("intent: another transaction is running the call of this key; retry once it ends")

// Do returns the provider's answer for key, calling it at most once
// across attempts: it takes the key's lock in tx, the handler's
// transaction, records the intent before calling (committed at once,
// outside tx), calls, and marks the intent done in tx. When an earlier
// attempt left the intent in flight, it asks reconcile before calling.
// When another transaction holds the key, it returns [ErrBusy] at once.
// An error from call or reconcile is returned as is (the handler returns
// it; the failure policy retries the record and the next attempt
// reconciles first).
//
// The lock is a transaction-level advisory lock on a 32-bit hash of key,
// released when tx ends (or rolls back to a savepoint taken before Do): a
// batch holds one per record that called Do, and two keys with the same
// hash at once take turns.
func (s *Store) Do(ctx context.Context, tx pgx.Tx, key string, call Call, reconcile Reconcile) ([]byte, Outcome, error) {
	if key == "" {
		return nil, Called, errors.New("intent: the key is empty; pass a stable idempotency key (the record's identity, a payment id)")
	}
	state, result, err := s.claim(ctx, tx, key)
	if err != nil {
		return nil, Called, err
	}
	if state == "done" {
		return result, Recorded, nil
	}
	fresh, err := s.record(ctx, tx, key)
	if err != nil {
		return nil, Called, err
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

// claim takes the lock of key in tx, then reads its intent: "" when there
// is none, "in_flight" or "done" (with its answer). Every attempt takes
// the lock before it reads, records or calls, so an attempt that recorded
// the intent while holding the lock knows that nobody called before it,
// and a call under way holds the lock until its transaction's outcome
// (done, or still in flight) is what the next holder reads. The read is a
// statement of its own, sent in the same round trip: its snapshot is
// taken once the lock is held, so an intent that another transaction
// marked done as it let go of the lock is seen done.
func (s *Store) claim(ctx context.Context, tx pgx.Tx, key string) (state string, result []byte, err error) {
	b := &pgx.Batch{}
	b.Queue(s.sql.lock, s.class, hash32(key))
	b.Queue(s.sql.read, key)
	br := tx.SendBatch(ctx, b)
	var locked bool
	err = br.QueryRow().Scan(&locked)
	if err == nil {
		err = br.QueryRow().Scan(&state, &result)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return "", nil, fmt.Errorf("intent: reading the intent of %q: %w", key, err)
	case !locked:
		return "", nil, consumer.Retryable(fmt.Errorf("%w (key %q)", ErrBusy, key))
	}
	return state, result, nil
}

// record writes the intent of key in flight, or counts one more attempt
// of an intent left in flight, in a transaction of its own that commits
// before the provider is asked or called: the count survives the
// attempt's rollback. fresh reports that this attempt wrote the intent;
// an intent already there that tx could not see (recorded on another
// database, or after the snapshot of a REPEATABLE READ tx) is reconciled
// as one left in flight.
func (s *Store) record(ctx context.Context, tx pgx.Tx, key string) (fresh bool, err error) {
	db, err := s.beginner(ctx, tx)
	if err != nil {
		return false, err
	}
	err = pgx.BeginFunc(ctx, db, func(itx pgx.Tx) error {
		var attempts int
		err := itx.QueryRow(ctx, s.sql.record, key).Scan(&attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // done already, where tx cannot see it
		}
		fresh = attempts == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("intent: recording the intent of %q: %w", key, err)
	}
	return fresh, nil
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
	cc := tx.Conn().Config()
	// One pool per database and runtime parameters (a search_path set in
	// code names another intents table on the same server).
	key := fmt.Sprint(cc.ConnString(), "\x00", cc.Host, cc.Port, cc.Database, cc.RuntimeParams)
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.own[key]; p != nil {
		return p, nil
	}
	cfg, err := pgxpool.ParseConfig(cc.ConnString())
	if err != nil {
		return nil, fmt.Errorf("intent: opening a connection for intents: %w", err)
	}
	// The handler's connection settings as they are, including those set
	// in code rather than in the connection string (a TLS configuration,
	// a password, a search_path among the runtime parameters).
	cfg.ConnConfig = cc.Copy()
	cfg.MaxConns = 4
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("intent: opening a connection for intents: %w", err)
	}
	if s.own == nil {
		s.own = map[string]*pgxpool.Pool{}
	}
	s.own[key] = p
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

// hash32 is the FNV-1a hash of s, as an advisory lock's half key.
func hash32(s string) int32 {
	h := fnv.New32a()
	h.Write([]byte(s)) //nolint:errcheck // a hash.Hash never fails
	return int32(h.Sum32())
}
