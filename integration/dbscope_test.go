package integration

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// dbEnv is a fresh database, migrated, with the effects table, and the
// environment a DB-scope child needs to reach it.
// withAppName returns env, a DATABASE_URL=... setting, with the URL's
// application_name set to name, so that the server's sessions of that
// process can be told apart.
func withAppName(t *testing.T, env, name string) string {
	t.Helper()
	raw := strings.TrimPrefix(env, "DATABASE_URL=")
	if !strings.Contains(raw, "://") { // a key=value connection string
		return env + " application_name=" + name
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return "DATABASE_URL=" + u.String()
}

func dbEnv(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	url := testenv.DatabaseT(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, effectsDDL); err != nil {
		t.Fatal(err)
	}
	return pool, "DATABASE_URL=" + url
}

func effectCount(t *testing.T, pool *pgxpool.Pool) (rows, unique int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT message_id) FROM effects`).Scan(&rows, &unique); err != nil {
		t.Fatal(err)
	}
	return rows, unique
}

// checkEffectsOrdered fails t unless every key's effects were applied in
// sequence order, each exactly once.
func checkEffectsOrdered(t *testing.T, pool *pgxpool.Pool, keys, perKey int) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT key, seq FROM effects ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	next := map[string]int{}
	for rows.Next() {
		var key string
		var seq int
		if err := rows.Scan(&key, &seq); err != nil {
			t.Fatal(err)
		}
		if seq != next[key] {
			t.Fatalf("key %s: effect of record %d applied when %d was due", key, seq, next[key])
		}
		next[key]++
	}
	if len(next) != keys {
		t.Fatalf("effects for %d keys, want %d", len(next), keys)
	}
	for k, n := range next {
		if n != perKey {
			t.Fatalf("key %s: %d effects, want %d", k, n, perKey)
		}
	}
}

// A child applies records in PostgreSQL and is killed (SIGKILL) before it
// ever commits a Kafka offset. After a restart the redelivered records are
// no-ops: the effects equal the unique records exactly. Without stored
// offsets the inbox catches every redelivery (counted as duplicates); with
// them the restarted consumer skips the applied records before the inbox
// and the handler: zero duplicate handler calls, zero inbox hits.
func TestDBCrashBetweenDBCommitAndKafkaCommit(t *testing.T) {
	for _, role := range []string{"db", "db-offsets"} {
		t.Run(role, func(t *testing.T) {
			k := testenv.KafkaT(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
			ctx := context.Background()
			pool, dbURL := dbEnv(t)
			const topic, group, keys, perKey = "crash-window", "g-crash-window", 20, 100
			if err := k.CreateTopic(ctx, topic, 3); err != nil {
				t.Fatal(err)
			}
			total := k.ProduceKeyed(t, topic, keys, perKey)

			first := testenv.NewObserver()
			c := startChild(t, k, role, group, topic, 300*time.Microsecond, first.Record,
				withAppName(t, dbURL, "kscope-killed-child"), childCommitEnv+"=1h") // never commits to Kafka while running
			testenv.WaitFor(t, time.Minute, "the first child to apply a third of the records", func() bool {
				n, _ := effectCount(t, pool)
				return n >= total/3
			})
			c.kill()
			// A COMMIT the child sent before it died may still be applied by
			// its server process: count once those are gone.
			testenv.WaitFor(t, time.Minute, "the killed child's database sessions to end", func() bool {
				var n int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'kscope-killed-child'`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n == 0
			})
			applied, _ := effectCount(t, pool)
			com, err := k.CommittedOffsets(ctx, group, topic)
			if err != nil {
				t.Fatal(err)
			}
			for p, o := range com {
				if o > 0 {
					t.Fatalf("partition %d has a committed Kafka offset %d: the crash was not in the window", p, o)
				}
			}

			second := testenv.NewObserver()
			c = startChild(t, k, role, group, topic, 0, second.Record, dbURL)
			testenv.WaitFor(t, time.Minute, "every record applied", func() bool {
				n, _ := effectCount(t, pool)
				return n >= total
			})
			testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
			if err := c.terminate(t); err != nil {
				t.Fatal(err)
			}
			rows, unique := effectCount(t, pool)
			if rows != total || unique != total {
				t.Fatalf("%d effects (%d unique) for %d records", rows, unique, total)
			}
			if calls := second.Handled(); calls != int64(total-applied) {
				t.Fatalf("the restarted child called the handler %d times; %d records were left to apply", calls, total-applied)
			}
			var st consumer.DBStats
			if err := json.Unmarshal([]byte(c.stats), &st); err != nil {
				t.Fatalf("child stats %q: %v", c.stats, err)
			}
			switch role {
			case "db":
				if st.Duplicates != int64(applied) {
					t.Fatalf("inbox caught %d duplicates, want the %d records applied before the crash", st.Duplicates, applied)
				}
			case "db-offsets":
				if st.Duplicates != 0 {
					t.Fatalf("with stored offsets the inbox still saw %d redeliveries", st.Duplicates)
				}
			}
			checkEffectsOrdered(t, pool, keys, perKey)
			t.Logf("%d applied before the kill; restart: %+v", applied, st)
		})
	}
}

// A child is killed at random moments 20 times while 20,000 records flow.
// The final database equals the reference computed from the input: every
// record's effect exactly once, each key's effects in order.
func TestDBKillLoop(t *testing.T) {
	k := testenv.KafkaT(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	ctx := context.Background()
	pool, dbURL := dbEnv(t)
	const topic, group, keys, perKey, kills = "kill-loop", "g-kill-loop", 50, 400, 20
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	total := keys * perKey
	obs := testenv.NewObserver()

	// The producer stays ahead of the consumers but keeps writing while the
	// kills happen.
	produced := make(chan error, 1)
	go func() {
		recs := testenv.KeyedRecords(topic, keys, perKey)
		for round := 0; round < perKey; round += 10 {
			for obs.Unique() < (round-40)*keys {
				time.Sleep(time.Millisecond)
			}
			if err := k.Produce(ctx, recs[round*keys:(round+10)*keys]...); err != nil {
				produced <- err
				return
			}
		}
		produced <- nil
	}()

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	for i := 0; i < kills; i++ {
		c := startChild(t, k, "db", group, topic, 100*time.Microsecond, obs.Record, dbURL)
		target := obs.Handled() + int64(200+rng.IntN(800))
		testenv.WaitFor(t, time.Minute, "the child to make progress", func() bool {
			return obs.Handled() >= target || obs.Unique() == total
		})
		c.kill()
	}
	c := startChild(t, k, "db", group, topic, 0, obs.Record, dbURL)
	testenv.WaitFor(t, 3*time.Minute, "every record applied", func() bool {
		n, _ := effectCount(t, pool)
		return n >= total
	})
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := c.terminate(t); err != nil {
		t.Fatal(err)
	}
	rows, unique := effectCount(t, pool)
	if rows != total || unique != total {
		t.Fatalf("%d effects (%d unique) for %d records after %d kills", rows, unique, total, kills)
	}
	checkEffectsOrdered(t, pool, keys, perKey)
	t.Logf("%d records, %d kills, %d handler calls", total, kills, obs.Handled())
}
