package dbscope

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/scope"
)

// PeriodicFunc does a partition's periodic work in tx, a transaction of
// its own on Options.Pool (not a record's): a nil error commits what it
// wrote, an error rolls it back. It must not commit or roll tx back
// itself.
type PeriodicFunc func(ctx context.Context, tx pgx.Tx, topic string, partition int32) error

// Periodic runs Func on every partition of the service's topics assigned
// to the member, every Interval, each call in a PostgreSQL transaction
// (Options.Periodic): for time-based work on the state the handlers
// keep, such as expiring rows that are too old. The runner schedules it as it schedules
// consumer.Config.Periodic's plain function, on a key-shard worker of
// the partition, with a handler's revoke and shutdown rules (see
// consumer.PeriodicConfig): never two calls for one partition at once,
// none after the partition's revoke or the runner's stop began, a running
// one waited for up to DrainTimeout, then its ctx canceled (its
// transaction then rolls back). A failed call (an error, a panic, a
// COMMIT that fails) is logged and counted in consumer.Stats.Periodic,
// and runs again at the next interval.
//
// The transaction runs beside the handlers' transactions of the
// partition's other key-shards, under PostgreSQL's ordinary rules: lock
// the rows it changes (or make its statements safe to run concurrently
// with theirs) as you would for any second writer. The partition's next
// owner runs its own calls; a call cut short by a revoke rolls back, so
// make each one complete in itself.
type Periodic struct {
	// Interval is how often Func runs for each assigned partition; at
	// least 10ms. Required with Func; 0 (the default) turns it off.
	Interval time.Duration
	// Func does the work for one partition, in its transaction.
	Func PeriodicFunc
}

var _ scope.Periodic = (*dbScope)(nil)

// PeriodicInterval implements scope.Periodic: Options.Periodic.Interval
// when Options.Periodic.Func is set.
func (s *dbScope) PeriodicInterval() time.Duration {
	if s.o.Periodic.Func == nil {
		return 0
	}
	return s.o.Periodic.Interval
}

// RunPeriodic implements scope.Periodic: Options.Periodic.Func in a
// transaction that commits when it returns nil.
func (s *dbScope) RunPeriodic(ctx context.Context, topic string, partition int32) error {
	return pgx.BeginFunc(ctx, s.o.Pool, func(tx pgx.Tx) error {
		return s.o.Periodic.Func(ctx, tx, topic, partition)
	})
}

// validatePeriodic checks Options.Periodic and reports each problem to
// bad.
func (o Options) validatePeriodic(bad func(field, format string, args ...any)) {
	const least = 10 * time.Millisecond
	p := o.Periodic
	switch {
	case p.Interval < 0 || (p.Interval > 0 && p.Interval < least):
		bad("Periodic.Interval", "is %s; set it to %s or more: how often Periodic.Func runs for each assigned partition (0 turns it off)", p.Interval, least)
	case p.Interval > 0 && p.Func == nil:
		bad("Periodic.Func", "is nil while Periodic.Interval is set; set the function to run in a transaction for each assigned partition, or leave Interval at 0")
	case p.Interval == 0 && p.Func != nil:
		bad("Periodic.Interval", "is 0 while Periodic.Func is set; set how often it runs for each assigned partition")
	}
}
