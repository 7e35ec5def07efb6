package integration

import (
	"context"
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
)

// shareChildLockEnv is the acquisition lock (ShareConfig.LockDuration) of
// the share-group children ("db-share", "alo-share"), which never renew
// it.
const shareChildLockEnv = "KSCOPE_CHILD_SHARE_LOCK"

// shareChildRenewEnv, when "1", makes the member renew its locks
// (ShareConfig.RenewBefore at a third of the lock) instead of letting the
// slow handlers outlive them.
const shareChildRenewEnv = "KSCOPE_CHILD_SHARE_RENEW"

// shareSlowEvery makes one record in that many (by value) slow on its
// first delivery in a share-group child.
const shareSlowEvery = 300

// shareSlow reports whether the handler of a share-group child outlives
// its lock on the first delivery of the record with value v.
func shareSlow(v []byte) bool {
	h := fnv.New32a()
	h.Write(v)
	return h.Sum32()%shareSlowEvery == 0
}

// runShareChild is a member of a share group, in the DB scope (db) or the
// AtLeastOnce scope, whose locks are never renewed: on its first delivery
// a slow record (shareSlow) runs for twice the lock and more, so that the
// broker hands it to another member meanwhile. Each handler call is
// reported (before it returns) as "REC <value> <delivery count>".
func runShareChild(ctx context.Context, cfg consumer.Config, db bool, maxDelay time.Duration, emit func([]byte)) int {
	lock, err := time.ParseDuration(os.Getenv(shareChildLockEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg.Share = &consumer.ShareConfig{RenewBefore: -1, LockDuration: lock}
	if os.Getenv(shareChildRenewEnv) == "1" {
		cfg.Share.RenewBefore = lock * 2 / 3
	}
	cfg.MaxInFlightRecords = 100
	work := func(ctx context.Context, r *consumer.Record) error {
		if maxDelay > 0 {
			time.Sleep(rand.N(maxDelay))
		}
		if r.DeliveryCount() == 1 && shareSlow(r.Value) {
			time.Sleep(2*lock + 500*time.Millisecond) // a handler that outlives its lock, and its context
		}
		emit(fmt.Appendf(nil, "%s %d", r.Value, r.DeliveryCount()))
		return nil
	}
	var run func(context.Context) error
	if db {
		pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer pool.Close()
		r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if err := work(ctx, r); err != nil {
				return err
			}
			key, seq, _ := testenv.ParseKeyed(r.Value)
			_, err := tx.Exec(context.WithoutCancel(ctx), `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`,
				consumer.Identity{}.Of(r), key, seq)
			return err
		}))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		run = r.Run
	} else {
		r, err := consumer.New(cfg, consumer.HandlerFunc(work))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		run = r.Run
	}
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// parseShareLine splits a share-group child's record line into the value
// and the delivery count.
func parseShareLine(line []byte) (value string, delivery int) {
	for i := len(line) - 1; i >= 0; i-- {
		if line[i] == ' ' {
			n, _ := strconv.Atoi(string(line[i+1:]))
			return string(line[:i]), n
		}
	}
	return string(line), 0
}
