package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// effectsDDL is the table DB-scope children write: one row per applied
// record and no unique constraint, so a double effect shows as two rows.
const effectsDDL = `CREATE TABLE IF NOT EXISTS effects (
	n bigserial PRIMARY KEY, message_id text NOT NULL, key text, seq int)`

// runDBChild consumes in the DB scope: each handler call is reported on
// stdout (before the transaction commits), and a graceful exit prints the
// scope's counters as JSON.
func runDBChild(ctx context.Context, cfg consumer.Config, storeOffsets bool, maxDelay time.Duration, emit func([]byte)) int {
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
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st, _ := json.Marshal(r.DBStats())
	fmt.Printf("%s%s\n", statsLinePref, st)
	return 0
}
