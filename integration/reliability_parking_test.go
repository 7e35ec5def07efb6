package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Ordered retries in the DB scope, with child consumers killed by SIGKILL
// at random moments and a producer that redelivers records (the same
// message id produced again): one record in eight fails on its first
// delivery and on its first hop, so that keys are parked behind it while
// members die. Every record's effect is applied once, in per-key order,
// nothing is lost, and a failed record puts at most one record per rung
// (plus the crash re-sends) into the retry topics. The long form
// (KSCOPE_RELIABILITY=long) kills at least ten members and sends at least
// a hundred records through the retry topics.
func TestReliabilityOrderedRetriesKillsRedeliveries(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	keys, perKey, nKills := 20, 20, 3
	if reliabilityLong() {
		keys, perKey, nKills = 100, 20, 12
	}
	k := testenv.KafkaT(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	url, pool := parkingDB(t)
	const topic, group = "payments", "g-rel-parking"
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logGroupOffsets(t, k, group, topic)
		}
	})
	// The stream, in per-key order; one record in ten is produced a
	// second time a little later, as a producer retry would.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 18))
	var stream []*kgo.Record
	failing := 0
	for seq := range perKey {
		for key := range keys {
			v := fmt.Sprintf("k%03d/%d", key, seq)
			r := &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%03d", key)), Value: []byte(v),
				Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(v)}}}
			stream = append(stream, r)
			if failsTwice(&consumer.Record{Record: r}) {
				failing++
			}
			if rng.IntN(10) == 0 {
				stream = append(stream, &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers})
			}
		}
	}
	unique := keys * perKey
	env := "DATABASE_URL=" + url
	applied := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM effects`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Produced in waves, a member killed after each.
	waves := nKills
	per := (len(stream) + waves - 1) / waves
	for w := range waves {
		batch := stream[w*per : min(len(stream), (w+1)*per)]
		if err := k.Produce(ctx, batch...); err != nil {
			t.Fatal(err)
		}
		c := startChild(t, k, "db-ordered", group, topic, 200*time.Microsecond, func([]byte) {}, env)
		target := min(unique, applied()+len(batch)/3)
		testenv.WaitFor(t, 2*time.Minute, "progress before the kill", func() bool { return applied() >= target })
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond) // a random moment, not a synchronisation
		c.kill()
	}
	last := startChild(t, k, "db-ordered", group, topic, 0, func([]byte) {}, env)
	testenv.WaitFor(t, 3*time.Minute, "every record applied", func() bool { return applied() == unique })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := last.terminate(t); err != nil {
		t.Fatalf("the last member exited with %v", err)
	}

	var rows, ids int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM effects`).Scan(&rows, &ids); err != nil {
		t.Fatal(err)
	}
	violations := 0
	vr, err := pool.Query(ctx, `SELECT key, seq FROM effects ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	lastSeq := map[string]int{}
	for vr.Next() {
		var key string
		var seq int
		if err := vr.Scan(&key, &seq); err != nil {
			t.Fatal(err)
		}
		if prev, ok := lastSeq[key]; ok && seq < prev {
			violations++
		}
		lastSeq[key] = max(lastSeq[key], seq)
	}
	vr.Close()
	retry := 0
	for _, d := range orderedChildPolicy().Ladder {
		retry += len(k.ReadAll(t, retrytopic.RetryTopic(group, d)))
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kscope_waiting`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d records (%d produced with redeliveries), %d failing twice, %d kills: %d effects, %d order violations, %d retry-topic records (%.2f per failed record)",
		unique, len(stream), failing, nKills, rows, violations, retry, float64(retry)/float64(max(failing, 1)))
	perFailed := float64(retry) / float64(max(failing, 1))
	lost := 0
	if ids < unique {
		lost = unique - ids
	}
	addRelRow(relRow{Scope: "DB", Records: unique, Kills: int64(nKills), Faults: int64(len(stream) - unique + failing),
		Fault: fmt.Sprintf("ordered retries with SIGKILLs and producer redeliveries (%d retry-topic records, %.2f per failed record, bound %d)",
			retry, perFailed, len(orderedChildPolicy().Ladder)+1),
		Lost: lost, Dups: rows - ids, Order: violations, Duration: time.Since(start), RetryPerFailed: perFailed,
		Passed: rows == unique && ids == unique && violations == 0 && left == 0})
	if rows != unique || ids != unique {
		t.Errorf("%d effects of %d identities, want %d: duplicates or losses", rows, ids, unique)
	}
	if violations != 0 {
		t.Errorf("%d order violations", violations)
	}
	if left != 0 {
		t.Errorf("%d records still waiting", left)
	}
	// Each failing record: two hops, plus what a kill re-sends.
	if bound := failing*(len(orderedChildPolicy().Ladder)+1) + nKills*keys; retry > bound {
		t.Errorf("%d retry-topic records for %d failing records, want at most %d", retry, failing, bound)
	}
	if reliabilityLong() && retry < 100 {
		t.Errorf("only %d records went through the retry topics, want at least 100", retry)
	}
}

// logParkingState logs what the parking tables hold and the inbox rows
// whose outcome is not final: what a stalled ordered pipeline waits on.
func logParkingState(t *testing.T, pool *pgxpool.Pool) {
	ctx := context.Background()
	queries := []struct{ name, sql string }{
		{"parked", `SELECT topic, encode(key, 'escape'), message_id, original_offset, stage, parked_at::text FROM kscope_parked ORDER BY parked_at`},
		{"waiting", `SELECT id::text, topic, encode(key, 'escape'), message_id, src_topic || '/' || src_partition || '/' || src_offset, head::text FROM kscope_waiting ORDER BY id LIMIT 50`},
		{"inbox", `SELECT message_id, status, attempt::text, stage::text, via FROM kscope_inbox WHERE status NOT IN ('applied', 'dead') ORDER BY message_id LIMIT 50`},
		{"stored offsets", `SELECT topic, partition::text, shard::text, next_offset::text FROM kscope_offsets ORDER BY topic, partition, shard LIMIT 200`},
	}
	for _, q := range queries {
		rows, err := pool.Query(ctx, q.sql)
		if err != nil {
			t.Logf("%s: %v", q.name, err)
			continue
		}
		n := 0
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Logf("%s: %v", q.name, err)
				break
			}
			t.Logf("%s: %v", q.name, vals)
			n++
		}
		rows.Close()
		t.Logf("%s: %d rows shown", q.name, n)
	}
}

// logGroupOffsets logs, for the input topic and the group's retry and
// dead-letter topics, each partition's committed offset beside its end
// (whether the records a stalled pipeline waits for were never consumed or
// were committed past), then the group's members and what each is
// assigned.
func logGroupOffsets(t *testing.T, k *testenv.Kafka, group, input string) {
	ctx := context.Background()
	listed, err := k.Admin().ListTopics(ctx)
	if err != nil {
		t.Logf("offsets: %v", err)
		return
	}
	for _, name := range listed.Names() {
		if name != input && !strings.HasPrefix(name, group+".") {
			continue
		}
		committed, err := k.CommittedOffsets(ctx, group, name)
		if err != nil {
			t.Logf("offsets: %s: %v", name, err)
			continue
		}
		end, err := k.EndOffsets(ctx, name)
		if err != nil {
			t.Logf("offsets: %s: %v", name, err)
			continue
		}
		t.Logf("offsets: %s: committed %v, end %v", name, committed, end)
	}
	described, err := k.Admin().DescribeGroups(ctx, group)
	if err != nil {
		t.Logf("group: %v", err)
		return
	}
	for _, g := range described {
		t.Logf("group %s: state %s, protocol %s, %d members, err %v", g.Group, g.State, g.Protocol, len(g.Members), g.Err)
		for _, m := range g.Members {
			assigned := map[string][]int32{}
			if a, ok := m.Assigned.AsConsumer(); ok {
				for _, at := range a.Topics {
					assigned[at.Topic] = at.Partitions
				}
			}
			t.Logf("group %s: member %s (%s): %v", g.Group, m.MemberID, m.ClientHost, assigned)
		}
	}
}

// parkingDB returns the URL of a database for DB-scope children and a pool
// on it, with kscope's tables and the effects table; a test that fails logs
// what the parking tables hold.
func parkingDB(t *testing.T) (string, *pgxpool.Pool) {
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
	t.Cleanup(func() {
		if t.Failed() {
			logParkingState(t, pool)
		}
	})
	return url, pool
}
