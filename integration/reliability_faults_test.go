package integration

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// TestReliabilityFaultMatrix runs every fault of the matrix against the DB
// scope and the Kafka scope where it applies; see reliability_test.go.
func TestReliabilityFaultMatrix(t *testing.T) {
	for _, sc := range relScenarios() {
		t.Run(sc.scope+"/"+sc.fault, func(t *testing.T) { runScenario(t, sc) })
	}
}

// brokerFaults installs faults on the cluster, waits (bounded) until each
// has been hit as often as its Count, then removes them and counts the hits.
func brokerFaults(e *relRun, fs ...kfake.Fault) {
	e.t.Helper()
	h, err := e.k.Fault(fs...)
	if err != nil {
		e.t.Fatal(err)
	}
	want := 0
	for _, f := range fs {
		want += max(f.Count, 1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Wait(ctx, want); err != nil {
		e.t.Logf("faults hit %d of %d times before the stream was done", h.Hits(), want)
	}
	e.faults.Add(int64(h.Hits()))
	h.Remove()
}

func kills() int {
	if reliabilityLong() {
		return 10
	}
	return 3
}

// killLoop starts child members and kills each with SIGKILL at a random
// moment after it made some progress.
func killLoop(e *relRun) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	n := kills()
	for range n {
		m := e.startChild()
		e.waitProgress(int64(e.total() / (3 * n)))
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond) // a random moment, not a synchronisation
		m.child.kill()
		e.kills.Add(1)
	}
}

// termLoop stops child members with SIGTERM after some progress: each
// must exit cleanly (Run returns nil after its final commit). Records
// still queued at the stop are not handled and their successor gets them;
// the check at the end proves nothing was lost or doubled.
func termLoop(e *relRun) {
	for range 2 {
		m := e.startChild()
		e.waitProgress(int64(e.total() / 5))
		if err := m.child.terminate(e.t); err != nil {
			e.t.Errorf("SIGTERM: the child exited with %v, want a clean exit", err)
		}
		e.faults.Add(1)
	}
}

// rebalanceStorm fails heartbeats, joins and syncs while members join and
// leave.
func rebalanceStorm(e *relRun) {
	h, err := e.k.Fault(
		kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, Group: e.group, Err: kerr.RebalanceInProgress, Count: 5},
		kfake.Fault{Keys: []kmsg.Key{kmsg.JoinGroup}, Group: e.group, Err: kerr.CoordinatorLoadInProgress, Count: 3},
		kfake.Fault{Keys: []kmsg.Key{kmsg.SyncGroup}, Group: e.group, Err: kerr.RebalanceInProgress, Count: 3},
	)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, name := range []string{"b", "c"} {
		m := e.start(name)
		e.faults.Add(1)
		e.waitProgress(int64(e.total() / 8))
		if err := m.leave(e.t); err != nil {
			e.t.Errorf("member %s: %v", name, err)
		}
		e.faults.Add(1)
	}
	e.faults.Add(int64(h.Hits()))
	h.Remove()
}

// moveCoordinator rehashes the coordinators until the group's moves to
// another broker, three times while records flow.
func moveCoordinator(e *relRun) {
	for range 3 {
		e.waitProgress(int64(e.total() / 8))
		old := e.k.Cluster.CoordinatorFor(e.group)
		for i := 0; i < 50 && e.k.Cluster.CoordinatorFor(e.group) == old; i++ {
			e.k.Cluster.RehashCoordinators()
		}
		e.faults.Add(1)
	}
}

// removeBroker removes the broker that coordinates the group, and adds it
// back after some progress.
func removeBroker(e *relRun) {
	rounds := 1
	if reliabilityLong() {
		rounds = 2
	}
	for range rounds {
		e.waitProgress(int64(e.total() / 8))
		node := e.k.Cluster.CoordinatorFor(e.group)
		if err := e.k.Cluster.RemoveNode(node); err != nil {
			e.t.Fatal(err)
		}
		e.faults.Add(1)
		e.waitProgress(int64(e.total() / 8))
		if _, _, err := e.k.Cluster.AddNode(node, 0); err != nil {
			e.t.Fatal(err)
		}
		e.faults.Add(1)
	}
}

// slowDuringRebalance makes some handlers outlast the drain timeout,
// ignoring their context, while a second member joins and the first
// leaves.
func slowDuringRebalance(slow *atomic.Bool) func(e *relRun) {
	return func(e *relRun) {
		slow.Store(true)
		e.start("b")
		e.waitProgress(int64(e.total() / 8))
		// A handler that ignores its canceled context past the drain
		// timeout makes Run say so when it returns; its late write must
		// still be harmless.
		if err := e.members[0].leave(e.t); err != nil && !strings.Contains(err.Error(), "ignored its canceled context") {
			e.t.Errorf("member a: %v", err)
		}
		slow.Store(false)
	}
}

func slowHandler(slow *atomic.Bool) func(e *relRun, ctx context.Context, tx pgx.Tx, r *consumer.Record, attempt int32) error {
	return func(e *relRun, ctx context.Context, tx pgx.Tx, r *consumer.Record, _ int32) error {
		if _, seq, _ := testenv.ParseKeyed(r.Value); seq%10 == 3 && slow.Load() {
			e.faults.Add(1)
			time.Sleep(time.Second) // a handler slower than DrainTimeout that ignores its context
		}
		return nil
	}
}

// waitFaults waits until n faults were injected by a handler hook.
func waitFaults(n int64) func(e *relRun) {
	return func(e *relRun) {
		testenv.WaitFor(e.t, 2*time.Minute, "the faults to be injected", func() bool { return e.faults.Load() >= n })
	}
}

func relScenarios() []relScenario {
	var dbSlow, kafkaSlow atomic.Bool
	shortDrain := func(c *consumer.Config) { c.DrainTimeout = 300 * time.Millisecond }
	flaky := func(e *relRun, ctx context.Context, tx pgx.Tx, r *consumer.Record, attempt int32) error {
		// Some records fail twice: in place, then through the retry topic.
		if _, seq, _ := testenv.ParseKeyed(r.Value); seq%17 == 5 && attempt <= 2 {
			return consumer.Retryable(errFlaky)
		}
		return nil
	}
	var out []relScenario
	for _, scope := range []string{"DB", "Kafka"} {
		commitKey := kmsg.OffsetCommit
		if scope == "Kafka" {
			commitKey = kmsg.TxnOffsetCommit
		}
		slow := &dbSlow
		if scope == "Kafka" {
			slow = &kafkaSlow
		}
		out = append(out,
			relScenario{scope: scope, fault: "consumer SIGKILL at random moments", children: true, inject: killLoop},
			relScenario{scope: scope, fault: "consumer SIGTERM (graceful stop) and restart", children: true, inject: termLoop},
			relScenario{scope: scope, fault: commitKey.Name() + " errors", broker: true, inject: func(e *relRun) {
				e.waitProgress(int64(e.total() / 10))
				brokerFaults(e, kfake.Fault{Keys: []kmsg.Key{commitKey}, Group: e.group, Err: kerr.CoordinatorNotAvailable, Count: 4},
					kfake.Fault{Keys: []kmsg.Key{commitKey}, Group: e.group, Err: kerr.RequestTimedOut, Count: 2})
			}},
			relScenario{scope: scope, broker: true, fault: "Fetch errors", inject: func(e *relRun) {
				brokerFaults(e, kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Err: kerr.NotLeaderForPartition, Count: 6},
					kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Err: kerr.UnknownServerError, Count: 3})
			}},
			relScenario{scope: scope, broker: true, fault: "FindCoordinator errors while coordinators move", inject: func(e *relRun) {
				e.waitProgress(int64(e.total() / 10))
				e.k.Cluster.RehashCoordinators()
				e.faults.Add(1)
				brokerFaults(e, kfake.Fault{Keys: []kmsg.Key{kmsg.FindCoordinator}, Err: kerr.CoordinatorNotAvailable, Count: 4})
			}},
			relScenario{scope: scope, broker: true, fault: "rebalance storm: Heartbeat/JoinGroup/SyncGroup errors, members join and leave", inject: rebalanceStorm},
			relScenario{scope: scope, broker: true, fault: "group coordinator moved", inject: moveCoordinator},
			relScenario{scope: scope, fault: "slow handler beyond the drain timeout during a rebalance",
				cfg: shortDrain, before: slowHandler(slow), inject: slowDuringRebalance(slow)},
		)
	}
	out = append(out,
		// The Kafka scope does not run this one on kfake: after partition
		// leaders move, kfake answers OffsetForLeaderEpoch for the epoch a
		// consumer read at with offset 0, which franz-go takes for log
		// truncation ("lost records ... reset to offset 0") and rewinds
		// behind offsets already committed in a transaction. A real broker
		// answers with the end of that epoch. The DB scope's inbox absorbs
		// the rewind, so it runs here.
		relScenario{scope: "DB", broker: true, fault: "coordinator broker removed and re-added", inject: removeBroker},
		relScenario{scope: "DB", broker: true, fault: "Produce errors on the retry and DLT routes", poison: 5, before: flaky, inject: func(e *relRun) {
			brokerFaults(e,
				kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: retrytopic.DLTopic(e.group), Err: kerr.NotLeaderForPartition, Count: 2},
				kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: retrytopic.DLTopic(e.group), Err: kerr.UnknownServerError, Count: 2},
				kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: retrytopic.RetryTopic(e.group, 200*time.Millisecond), Err: kerr.UnknownServerError, Count: 2})
		}},
		relScenario{scope: "Kafka", broker: true, fault: "Produce errors on the outputs and the DLT route", poison: 5, inject: func(e *relRun) {
			brokerFaults(e,
				kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: e.topic + ".out", Err: kerr.UnknownServerError, Count: 3},
				kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: retrytopic.DLTopic(e.group), Err: kerr.UnknownServerError, Count: 2})
		}},
		relScenario{scope: "Kafka", broker: true, fault: "EndTxn errors", inject: func(e *relRun) {
			e.waitProgress(int64(e.total() / 10))
			brokerFaults(e, kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.TransactionAbortable, Count: 3})
		}},
		relScenario{scope: "DB", fault: "PostgreSQL backend terminated mid-transaction",
			pool: func(c *pgxpool.Config) { c.MaxConns = 8 },
			before: func(e *relRun, ctx context.Context, tx pgx.Tx, r *consumer.Record, _ int32) error {
				if _, seq, _ := testenv.ParseKeyed(r.Value); seq%13 == 3 && e.faults.Load() < 4 {
					var pid int
					if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
						return err
					}
					if _, err := e.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
						return err
					}
					e.faults.Add(1)
				}
				return nil
			}, inject: waitFaults(4)},
		relScenario{scope: "DB", fault: "PostgreSQL server restarted mid-run", inject: func(e *relRun) {
			pg := testenv.SharedPostgres(e.t)
			if pg.Kind != "local" {
				e.t.Skipf("restarting PostgreSQL needs the throwaway local server, this one is %s", pg.Kind)
			}
			rounds := 1
			if reliabilityLong() {
				rounds = 2
			}
			for range rounds {
				e.waitProgress(int64(e.total() / 6))
				if err := pg.Restart(context.Background()); err != nil {
					e.t.Fatal(err)
				}
				e.faults.Add(1)
			}
		}},
		relScenario{scope: "DB", fault: "PostgreSQL statement timeout",
			pool: func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["statement_timeout"] = "200" },
			before: func(e *relRun, ctx context.Context, tx pgx.Tx, r *consumer.Record, attempt int32) error {
				if _, seq, _ := testenv.ParseKeyed(r.Value); seq%11 == 2 && attempt == 1 {
					_, err := tx.Exec(ctx, `SELECT pg_sleep(1)`)
					e.faults.Add(1)
					return err
				}
				return nil
			}, inject: waitFaults(3)},
		relScenario{scope: "DB", fault: "PostgreSQL pool exhausted", pool: func(c *pgxpool.Config) { c.MaxConns = 2 }, inject: func(e *relRun) {
			for range 3 {
				e.waitProgress(int64(e.total() / 10))
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				a, err := e.pool.Acquire(ctx)
				if err != nil {
					e.t.Fatal(err)
				}
				b, err := e.pool.Acquire(ctx)
				if err != nil {
					e.t.Fatal(err)
				}
				time.Sleep(300 * time.Millisecond) // the pool stays exhausted this long: the fault itself
				a.Release()
				b.Release()
				cancel()
				e.faults.Add(1)
			}
		}},
	)
	return out
}

type flakyError struct{}

func (flakyError) Error() string { return "a dependency is briefly unavailable" }

var errFlaky = flakyError{}
