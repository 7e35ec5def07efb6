package dbscope_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// The backend of a transaction is terminated mid-batch: the transaction
// aborts, the batch is retried on a new connection, nothing is applied twice.
func TestConnectionLossMidBatch(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "connloss", "g-connloss"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, topic, 20, 25)
	var killed atomic.Int64
	r, err := dbscope.New(baseConfig(k, group, topic), dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			if err := insertEffect(ctx, tx, r); err != nil {
				return err
			}
			// Every 97th record, after writing, has its backend
			// terminated from another connection, as an operator or a
			// failover would.
			if r.Offset%97 == 13 && killed.Load() < 5 {
				var pid int
				if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					return err
				}
				if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
					return err
				}
				killed.Add(1)
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "every record applied", 2*time.Minute, func() bool { return r.Stats().DB.Applied == int64(total) })
	if killed.Load() == 0 {
		t.Fatal("no backend was terminated: the test did not test anything")
	}
	if st := r.Stats().DB; st.TxRetries < killed.Load() {
		t.Fatalf("%d backends terminated but %d transactions retried", killed.Load(), st.TxRetries)
	}
	if c := countEffects(t, pool); c.rows != total || c.unique != total {
		t.Fatalf("effects %+v, want exactly %d", c, total)
	}
}

// A zombie: the old owner of a partition is still inside its transaction for
// a record when a rebalance hands the partition to a new owner, which takes
// the same record. Both try; one effect results.
func TestZombieAfterRebalanceHasOneEffect(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "zombie", "g-zombie"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("acct"), Value: []byte("acct/0"),
		Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte("pi_zombie")}}}); err != nil {
		t.Fatal(err)
	}
	inside := make(chan struct{})
	release := make(chan struct{})
	var oldCalls, newCalls atomic.Int64
	cfgA := baseConfig(k, group, topic)
	cfgA.DrainTimeout = 200 * time.Millisecond // the revoke gives up on the zombie quickly
	cfgA.ClientOptions = []kgo.Opt{kgo.HeartbeatInterval(50 * time.Millisecond)}
	a, err := dbscope.New(cfgA, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			oldCalls.Add(1)
			close(inside)
			<-release // ignores its context: a zombie
			return insertEffect(context.WithoutCancel(ctx), tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stopA := run(t, a)
	<-inside

	cfgB := baseConfig(k, group, topic)
	cfgB.ClientOptions = []kgo.Opt{kgo.HeartbeatInterval(50 * time.Millisecond)}
	b, err := dbscope.New(cfgB, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			newCalls.Add(1)
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stopB := run(t, b)
	// The old owner leaves (a deploy, say). Its revoke gives up on the
	// zombie after the drain timeout and hands the partition over.
	aStopped := make(chan error, 1)
	go func() { aStopped <- stopA() }()
	// The new owner's insert of the same inbox row waits on the zombie's
	// uncommitted one.
	testenv.WaitFor(t, time.Minute, "the new owner to block on the zombie's inbox row", func() bool {
		return waitingOnLock(t, pool)
	})
	close(release)
	testenv.WaitFor(t, time.Minute, "the new owner to finish the record", func() bool { return b.Stats().Done >= 1 })
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	// The old owner's Run reports the handler that ignored its context.
	if err := <-aStopped; err != nil && !strings.Contains(err.Error(), "ignored its canceled context") {
		t.Fatal(err)
	}
	if c := countEffects(t, pool); c.rows != 1 {
		t.Fatalf("%d effects for one record handled by a zombie and its successor (old owner calls %d, new %d)",
			c.rows, oldCalls.Load(), newCalls.Load())
	}
}

func waitingOnLock(t testing.TB, pool *pgxpool.Pool) bool {
	var n int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// With stored offsets, a consumer whose Kafka offset commits all failed
// resumes, on its next assignment, from the position stored in the
// database: the applied records are not even fetched again.
func TestStoredOffsetsResumeAheadOfKafka(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "resume", "g-resume"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, topic, 10, 30)
	// Every offset commit of the group fails, as with a coordinator that
	// is down: Kafka never learns how far the consumer got.
	fault, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.CoordinatorNotAvailable, Count: -1})
	if err != nil {
		t.Skip(err) // broker faults need the in-process kfake cluster
	}
	cfg := baseConfig(k, group, topic)
	cfg.Shards = 2
	opts := dbscope.Options{Pool: pool, StoreOffsets: true}
	first, err := dbscope.New(cfg, opts, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, first)
	testenv.WaitFor(t, time.Minute, "every record applied", func() bool { return first.Stats().DB.Applied == int64(total) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if com, _ := k.CommittedOffsets(ctx, group, topic); com[0] != 0 {
		t.Fatalf("Kafka has committed offset %d although every commit failed", com[0])
	}
	fault.Remove()

	var calls atomic.Int64
	second, err := dbscope.New(cfg, opts, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		calls.Add(1)
		return insertEffect(ctx, tx, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	// One more record, so the second consumer has something to do.
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("late"), Value: []byte("late/0")}); err != nil {
		t.Fatal(err)
	}
	stop = run(t, second)
	testenv.WaitFor(t, time.Minute, "the new record applied", func() bool { return second.Stats().DB.Applied == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// The fetch resumes at the lowest shard's stored position; the few
	// records between it and the other shard's are skipped by the stored
	// positions too, neither reaching the inbox nor the handler.
	if st := second.Stats().DB; st.Duplicates != 0 || st.ReplaySkipped >= int64(total)/4 || calls.Load() != 1 {
		t.Fatalf("after resuming from the database: %+v, %d handler calls; want the applied records (almost all) never fetched", st, calls.Load())
	}
	if c := countEffects(t, pool); c.rows != total+1 {
		t.Fatalf("%d effects, want %d", c.rows, total+1)
	}
}

// Records of one batch hit a statement timeout one after another, each
// the first time its statement runs: every timeout rolls the transaction
// back, and the records before the one that timed out commit on their own
// before it runs again, so the batch makes progress record by record
// instead of restarting from its first record with a growing backoff.
// Each record is applied once, each key's records in order.
func TestStatementTimeoutsOneByOne(t *testing.T) {
	for _, queued := range []bool{false, true} {
		name := "Handler"
		if queued {
			name = "QueueHandler"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			k := testenv.KafkaT(t)
			pool := newPool(t)
			topic, group := "stmt-timeout-"+name, "g-stmt-timeout-"+name
			if err := k.CreateTopic(ctx, topic, 1); err != nil {
				t.Fatal(err)
			}
			total := k.ProduceKeyed(t, topic, 20, 10)
			slow := func(r *consumer.Record) bool { return r.Offset%20 == 7 }
			// A slow record's statement sleeps past the statement timeout
			// the first time it runs: a sequence, which a rollback does
			// not undo, counts its runs.
			for off := 7; off < total; off += 20 {
				if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE SEQUENCE slow_%d`, off)); err != nil {
					t.Fatal(err)
				}
			}
			stmts := func(r *consumer.Record) []string {
				return []string{
					`SET LOCAL statement_timeout = '50ms'`,
					fmt.Sprintf(`SELECT CASE WHEN nextval('slow_%d') = 1 THEN pg_sleep(2) END`, r.Offset),
					`SET LOCAL statement_timeout = 0`,
				}
			}
			var mu sync.Mutex
			checked := map[int64]bool{}
			var behind []string
			// check runs at each call of a slow record: once its statement
			// has timed out, every record before it must be durable.
			check := func(r *consumer.Record) {
				var fired bool
				if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT is_called FROM slow_%d`, r.Offset)).Scan(&fired); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if !fired || checked[r.Offset] {
					return
				}
				checked[r.Offset] = true
				var durable int64
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&durable); err != nil {
					t.Error(err)
				}
				if durable != r.Offset {
					behind = append(behind, fmt.Sprintf("offset %d ran again with %d earlier records durable", r.Offset, durable))
				}
			}
			cfg := baseConfig(k, group, topic)
			cfg.Shards = 1
			var r *dbscope.Runner
			var err error
			if queued {
				r, err = dbscope.NewQueued(cfg, dbscope.Options{Pool: pool}, dbscope.QueueFunc(
					func(ctx context.Context, q *dbscope.Queue, r *consumer.Record) error {
						if slow(r) {
							check(r)
							for _, s := range stmts(r) {
								q.Exec(s)
							}
						}
						return queueEffect(ctx, q, r)
					}))
			} else {
				r, err = dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
					func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
						if slow(r) {
							check(r)
							for _, s := range stmts(r) {
								if _, err := tx.Exec(ctx, s); err != nil {
									return err
								}
							}
						}
						return insertEffect(ctx, tx, r)
					}))
			}
			if err != nil {
				t.Fatal(err)
			}
			runToEnd(t, r, k, group, topic, "every record applied", 2*time.Minute, func() bool { return r.Stats().DB.Applied == int64(total) })
			if c := countEffects(t, pool); c.rows != total || c.unique != total {
				t.Fatalf("effects %+v, want %d", c, total)
			}
			wantKeyOrder(t, pool)
			mu.Lock()
			defer mu.Unlock()
			if len(behind) > 0 {
				t.Fatalf("a timed-out record ran again before the records ahead of it were durable: %v", behind)
			}
			if got, want := r.Stats().DB.TxRetries, int64(total/20); got != want || len(checked) != total/20 {
				t.Fatalf("%d transaction retries and %d slow records seen timed out, want %d of each", got, len(checked), want)
			}
		})
	}
}
