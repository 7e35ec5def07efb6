package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// effectsDDL is the table DB-scope children write: one row per applied
// record and no unique constraint, so a double effect shows as two rows.
const effectsDDL = `CREATE TABLE IF NOT EXISTS effects (
	n bigserial PRIMARY KEY, message_id text NOT NULL, key text, seq int)`

// runDBChild consumes in the DB scope: each handler call is reported on
// stdout (before the transaction commits), and a graceful exit prints the
// scope's counters as JSON.
func runDBChild(ctx context.Context, cfg consumer.Config, storeOffsets bool, maxDelay time.Duration, emit func([]byte)) int {
	return runDBChildFailing(ctx, cfg, storeOffsets, maxDelay, emit, nil)
}

// orderedChildPolicy is the failure policy of the "db-ordered" child:
// ordered retries through two short retry topics.
func orderedChildPolicy() retrytopic.Policy {
	return retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, InPlaceAttempts: 1,
		Ladder: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}, RetryableAttempts: 10}
}

// failsTwice reports whether record r fails on this attempt in the
// "db-ordered" child: one record in eight (by message id) fails on its
// first delivery and on its first hop through the retry topics, whatever
// process handles it, and succeeds on its second hop.
func failsTwice(r *consumer.Record) bool {
	id, _ := r.Header(consumer.DefaultMessageIDHeader)
	h := fnv.New32a()
	h.Write(id)
	if h.Sum32()%8 != 0 {
		return false
	}
	attempt, _ := r.Header(retrytopic.HeaderAttempt)
	n, _ := strconv.Atoi(string(attempt))
	return n < 2
}

// runDBChildFailing is runDBChild whose handler first asks fail whether the
// attempt fails (with a retryable error).
func runDBChildFailing(ctx context.Context, cfg consumer.Config, storeOffsets bool, maxDelay time.Duration, emit func([]byte), fail func(*consumer.Record) bool) int {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool, StoreOffsets: storeOffsets}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if maxDelay > 0 {
				time.Sleep(rand.N(maxDelay))
			}
			if fail != nil && fail(r) {
				return consumer.Retryable(errors.New("payment gateway 503"))
			}
			key, seq, _ := testenv.ParseKeyed(r.Value)
			if _, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`,
				consumer.Identity{}.Of(r), key, seq); err != nil {
				return err
			}
			emit(r.Value)
			return nil
		}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	childRunner.Store(r.Runner)
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st, _ := json.Marshal(r.Stats().DB)
	fmt.Printf("%s%s\n", statsLinePref, st)
	return 0
}
