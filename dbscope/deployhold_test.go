package dbscope_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// A handler whose table does not exist yet (a forgotten migration of the
// service's own schema) holds the pipeline: no record goes to a retry
// topic or the dead-letter topic, the hold shows in Stats().Hold and to
// the hooks, and once the table is created every record is applied
// exactly once, in per-key order, and the offsets commit. For a Handler
// (its INSERT cannot be prepared) and a QueueHandler (its queued INSERT
// fails at the batch's end).
func TestMissingTableHoldsThePipeline(t *testing.T) {
	const insert = `INSERT INTO later_effects (message_id, key, seq) VALUES ($1, $2, $3)`
	args := func(r *consumer.Record) []any {
		key, seq, _ := testenv.ParseKeyed(r.Value)
		return []any{consumer.Identity{}.Of(r), key, seq}
	}
	for _, tc := range []struct {
		name string
		h    dbscope.Handler
		qh   dbscope.QueueHandler
	}{
		{name: "handler", h: dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			_, err := tx.Exec(ctx, insert, args(r)...)
			return err
		})},
		{name: "queued", qh: dbscope.QueueFunc(func(_ context.Context, q *dbscope.Queue, r *consumer.Record) error {
			q.Exec(insert, args(r)...)
			return nil
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			k := testenv.KafkaT(t)
			pool := newPool(t)
			topic, group := "orders-"+tc.name, "g-missing-table-"+tc.name
			if err := k.CreateTopic(ctx, topic, 2); err != nil {
				t.Fatal(err)
			}
			var logs testenv.LogBuffer
			holds := &holdRecorder{}
			cfg := baseConfig(k, group, topic)
			cfg.Logger = logs.Logger()
			cfg.Hooks = []hook.Hook{holds}
			// The default budget of an unclassified error: 3 attempts in
			// place, then the DLT, within milliseconds.
			cfg.Failures = retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
			r := newEither(t, cfg, dbscope.Options{Pool: pool}, tc.h, tc.qh)
			run(t, r)
			n := k.ProduceKeyed(t, topic, 4, 5)

			testenv.WaitFor(t, time.Minute, "the pipeline held, its transactions retried", func() bool {
				st := r.Stats()
				if f := st.Failures; f.DeadLettered+f.RetryTopic > 0 {
					t.Fatalf("records were routed while the table is missing: %+v", f)
				}
				return st.Hold.Shards > 0 && st.DB.TxRetries >= 8
			})
			st := r.Stats()
			if !strings.Contains(st.Hold.Err, "42P01") || st.Hold.Since.IsZero() || st.Hold.Holds != 1 {
				t.Fatalf("Stats().Hold = %+v, want a hold begun once, by SQLSTATE 42P01", st.Hold)
			}
			if f := st.Failures; f.DeadLettered != 0 || f.RetryTopic != 0 || f.Retries != 0 || st.DB.Failed != 0 {
				t.Fatalf("while held: failures %+v, %d failed: want no record retried, routed or failed", f, st.DB.Failed)
			}
			routes := append([]string{retrytopic.DLTopic(group)}, r.Config().Failures.RetryTopics()...)
			wantEmpty(t, k, routes)

			if _, err := pool.Exec(ctx, `CREATE TABLE later_effects (n bigserial PRIMARY KEY, message_id text NOT NULL, key text, seq int)`); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 2*time.Minute, "every record applied once the table exists", func() bool {
				return tableCount(t, pool, `SELECT count(*) FROM later_effects`) == n
			})
			testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
			if u := tableCount(t, pool, `SELECT count(DISTINCT message_id) FROM later_effects`); u != n {
				t.Fatalf("%d distinct records applied, want %d, each once", u, n)
			}
			wantOrder(t, pool)
			wantEmpty(t, k, routes)
			testenv.WaitFor(t, 10*time.Second, "the hold ended", func() bool { return r.Stats().Hold.Shards == 0 })
			if st := r.Stats(); st.Hold.Err != "" || !st.Hold.Since.IsZero() {
				t.Fatalf("Stats().Hold = %+v after the pipeline resumed", st.Hold)
			}
			if first, last := holds.ends(); first != 1 || last != 0 {
				t.Fatalf("the hold hook saw %d key-shards first and %d last, want 1 then 0", first, last)
			}
			out := logs.String()
			if c := strings.Count(out, "the pipeline holds"); c != 1 {
				t.Fatalf("the hold was logged %d times, want once:\n%s", c, out)
			}
			if c := strings.Count(out, "the pipeline resumed"); c != 1 {
				t.Fatalf("the resumption was logged %d times, want once:\n%s", c, out)
			}
			if !strings.Contains(out, "level=ERROR msg=\"kscope: the pipeline holds") {
				t.Fatalf("the hold was not logged at ERROR:\n%s", out)
			}
		})
	}
}

// A deployment error the failure policy classifies (Policy.Classify, or
// a class the handler marks) is the record's fault again: it follows the
// policy, here to the dead-letter topic, and nothing holds.
func TestClassifiedDeploymentErrorIsRouted(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "named-tables", "g-classified-deployment"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Failures.Classify = func(err error) (consumer.Class, bool) {
		var pg *pgconn.PgError
		if errors.As(err, &pg) && pg.Code == "42P01" {
			return consumer.ClassTerminal, true // the record names its table
		}
		return 0, false
	}
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{string(r.Value)}.Sanitize()+` VALUES (1)`)
		return err
	}))
	if err != nil {
		t.Fatal(err)
	}
	run(t, r)
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("no_such_table_a")},
		&kgo.Record{Topic: topic, Key: []byte("b"), Value: []byte("no_such_table_b")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "both records dead-lettered", func() bool { return r.Stats().Failures.DeadLettered == 2 })
	if st := r.Stats(); st.Hold.Holds != 0 {
		t.Fatalf("Stats().Hold = %+v, want no hold for a classified error", st.Hold)
	}
}

// holdRecorder is a hook.HoldHook that keeps what it was told.
type holdRecorder struct {
	mu     sync.Mutex
	shards []int
}

func (h *holdRecorder) OnHold(x hook.Hold) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.shards = append(h.shards, x.Shards)
}

// ends returns the first and the last key-shard count reported (-1 when
// none was).
func (h *holdRecorder) ends() (first, last int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.shards) == 0 {
		return -1, -1
	}
	return h.shards[0], h.shards[len(h.shards)-1]
}

// wantEmpty fails the test unless the topics hold no record.
func wantEmpty(t *testing.T, k *testenv.Kafka, topics []string) {
	t.Helper()
	for _, tp := range topics {
		ends, err := k.EndOffsets(context.Background(), tp)
		if err != nil {
			t.Fatal(err)
		}
		for p, end := range ends {
			if end != 0 {
				t.Fatalf("%s[%d] holds %d records, want none", tp, p, end)
			}
		}
	}
}

func tableCount(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// wantOrder fails the test unless each key's records were applied to
// later_effects in sequence order.
func wantOrder(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT key, seq FROM later_effects ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	last := map[string]int{}
	for rows.Next() {
		var key string
		var seq int
		if err := rows.Scan(&key, &seq); err != nil {
			t.Fatal(err)
		}
		if prev, ok := last[key]; ok && seq != prev+1 {
			t.Fatalf("key %s applied %d after %d", key, seq, prev)
		}
		last[key] = seq
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}
