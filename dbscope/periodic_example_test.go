package dbscope_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
)

// A sessions service keeps one row per open session, keyed by the
// session's partition. Every minute, for each partition assigned to it,
// it closes the sessions idle for an hour, in a transaction that commits
// when the function returns nil.
func ExamplePeriodic() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/sessions")
	if err != nil {
		log.Fatal(err)
	}
	r, err := dbscope.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "sessions",
		Topics:  []string{"logins"},
	}, dbscope.Options{
		Pool: pool,
		Periodic: dbscope.Periodic{
			Interval: time.Minute,
			Func: func(ctx context.Context, tx pgx.Tx, topic string, p int32) error {
				_, err := tx.Exec(ctx, `DELETE FROM sessions WHERE partition = $1 AND last_seen < now() - interval '1 hour'`, p)
				return err // an error rolls the delete back; it runs again at the next interval
			},
		},
	}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		_, err := tx.Exec(ctx, `INSERT INTO sessions (id, partition, last_seen) VALUES ($1, $2, now())
			ON CONFLICT (id) DO UPDATE SET last_seen = now()`, r.Key, r.Partition)
		return err
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
