package consumer

import (
	"context"
	"time"

	"github.com/kscope-dev/kscope/scope"
)

// minIdleWork is the shortest Idle.After and Periodic.Interval: the runner
// looks at its partitions' activity and schedules at most this often.
const minIdleWork = 10 * time.Millisecond

// IdleConfig calls functions of the service's when a partition, or the
// whole member, has had no record for a while (Config.Idle): to flush
// what a service buffers, close a file, or report that a source went
// quiet. A partition is idle while no record of it is polled and none is
// unfinished; the member is idle while all its partitions are (also while
// it has none). The partitions of kscope's own topics the runner consumes
// (the retry topics, a scope's delay topics) get no Partition call, but
// their records keep the member from being idle. A partition a pause holds
// (Runner.Pause) gets no Partition call: its idle period starts when it
// resumes; it does not keep the member from being idle. In every scope.
//
// Each function is called once per idle period, After into it: not again
// while the partition (or member) stays idle, and again once records
// flowed and it went idle anew. since is when the period began: when the
// partition's last record was polled or finished, or it was assigned (for
// the member: when any of its partitions last had a record, or Run
// started), to within a tenth of After. The calls run on goroutines of
// their own, never on the poll loop or a key-shard worker, and may run
// concurrently with each other and with the handlers. ctx ends when the
// runner stops, and, for Partition, when the partition is revoked or lost;
// Run waits for the calls to return before it returns. A panic is logged
// as an error.
type IdleConfig struct {
	// After is how long a partition (or the member) must have had no
	// record before its function is called; at least 10ms. Required
	// with either function; 0 (the default) turns idle calls off.
	After time.Duration
	// Partition, when set, is called for a partition idle for After.
	Partition func(ctx context.Context, topic string, partition int32, since time.Time)
	// Member, when set, is called when every partition of the member
	// has been idle for After.
	Member func(ctx context.Context, since time.Time)
}

// PeriodicConfig runs a function of the service's on every partition of
// its topics (Topics and TopicPatterns, not kscope's retry topics)
// assigned to the member, every Interval (Config.Periodic): for
// time-based work on the partition's state, such as expiring what is too
// old. The first call comes Interval after the partition's assignment;
// while it is assigned, the next comes Interval after the previous one
// was scheduled (to within a tenth of Interval), or, when a call runs
// longer than Interval, right after it returned.
//
// The call runs on the key-shard worker of the partition's null-key
// records, in order with that key-shard's records, with the same revoke and shutdown rules
// as a handler: never two calls for one partition at once; none begins
// after the partition's revoke or the runner's stop began; a revoke and a
// stop wait for a running call up to DrainTimeout, then cancel its ctx.
// A slow call holds the records of its key-shard meanwhile, as a slow
// handler does. An error (or a panic) is logged and counted in
// Stats.Periodic.Errors, and the call runs again at the next interval.
//
// In the AtLeastOnce scope, and in the Kafka scope (txn.New), Func is a
// plain call: in the Kafka scope it runs outside the Kafka transaction
// (what it produces is not part of it) and a revoke cancels its ctx at
// once, as it stops the partition's records. In the DB scope, use
// dbscope.Options.Periodic instead, which runs in a PostgreSQL
// transaction that commits when it returns nil; setting both is refused.
// The partition's next owner runs its own calls; a call cut short by a
// revoke is not finished by anyone, so make each one complete in itself.
type PeriodicConfig struct {
	// Interval is how often Func runs for each assigned partition; at
	// least 10ms. Required with Func; 0 (the default) turns it off.
	Interval time.Duration
	// Func does the work for one partition.
	Func func(ctx context.Context, topic string, partition int32) error
}

// PeriodicStats count the calls of the periodic work (Config.Periodic, or
// the scope's own, such as dbscope.Options.Periodic), in [Stats].Periodic.
type PeriodicStats struct {
	Runs   int64 // calls that returned nil (in the DB scope: whose transaction committed)
	Errors int64 // calls that failed or panicked (in the DB scope: rolled back), each logged; retried at the next interval
}

// validateIdleWork checks Config.Idle and Config.Periodic, and reports
// each problem to bad.
func (c Config) validateIdleWork(bad func(field, format string, args ...any)) {
	i, p := c.Idle, c.Periodic
	switch {
	case i.After < 0 || (i.After > 0 && i.After < minIdleWork):
		bad("Idle.After", "is %s; set it to %s or more: how long a partition or the member must have had no record before Idle's functions are called (0 turns them off)", i.After, minIdleWork)
	case i.After > 0 && i.Partition == nil && i.Member == nil:
		bad("Idle.After", "is set but Idle.Partition and Idle.Member are nil; set the function to call, or leave After at 0")
	case i.After == 0 && (i.Partition != nil || i.Member != nil):
		bad("Idle.After", "is 0 while Idle.Partition or Idle.Member is set; set how long a partition or the member must have had no record before they are called")
	}
	switch {
	case p.Interval < 0 || (p.Interval > 0 && p.Interval < minIdleWork):
		bad("Periodic.Interval", "is %s; set it to %s or more: how often Periodic.Func runs for each assigned partition (0 turns it off)", p.Interval, minIdleWork)
	case p.Interval > 0 && p.Func == nil:
		bad("Periodic.Func", "is nil while Periodic.Interval is set; set the function to run for each assigned partition, or leave Interval at 0")
	case p.Interval == 0 && p.Func != nil:
		bad("Periodic.Interval", "is 0 while Periodic.Func is set; set how often it runs for each assigned partition")
	}
}

// checkPeriodic refuses Config.Periodic for a scope that has periodic work
// of its own (scope.Periodic).
func checkPeriodic(cfg Config, s workScope) error {
	if p, ok := s.(scope.Periodic); ok && p.PeriodicInterval() > 0 && cfg.Periodic.Func != nil {
		return &ConfigError{Field: "Periodic", Reason: "is set, and the scope runs periodic work of its own (dbscope.Options.Periodic, in a transaction); set only one of them"}
	}
	return nil
}

// periodicWork returns the runner's periodic work: the scope's own
// (scope.Periodic) when it has some, else Config.Periodic's; a nil
// function when there is none.
func (r *Runner) periodicWork() (time.Duration, func(ctx context.Context, topic string, partition int32) error) {
	if p, ok := r.unit.(scope.Periodic); ok && p.PeriodicInterval() > 0 {
		return p.PeriodicInterval(), p.RunPeriodic
	}
	if r.cfg.Periodic.Interval <= 0 {
		return 0, nil
	}
	return r.cfg.Periodic.Interval, r.cfg.Periodic.Func
}
