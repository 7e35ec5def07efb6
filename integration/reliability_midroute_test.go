package integration

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// midRouteRung is the one rung of the "db-midroute" children's ladder.
const midRouteRung = 3 * time.Second

// midRouteChildPolicy is the failure policy of the "db-midroute" children:
// one retry topic; unordered parks no new failure.
func midRouteChildPolicy(unordered bool) retrytopic.Policy {
	return retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, InPlaceAttempts: 1,
		Ladder: []time.Duration{midRouteRung}, RetryableAttempts: 10, Unordered: unordered}
}

// failsMidRoute reports whether record r fails in a child of role: in
// "db-midroute-park", the key's first record (A) always fails, so that it
// stays in the retry topic with the rest of its key waiting behind it; in
// the others, its second record (B) fails when it is released from
// PostgreSQL (before any hop), and so becomes the key's head.
func failsMidRoute(role string, r *consumer.Record) bool {
	_, seq, _ := testenv.ParseKeyed(r.Value)
	if role == "db-midroute-park" {
		return seq == 0
	}
	attempt, _ := r.Header(retrytopic.HeaderAttempt)
	n, _ := strconv.Atoi(string(attempt))
	return seq == 1 && n < 1
}

// A key's head left mid-route by a member killed with SIGKILL, with more
// records of the key waiting behind it than one release transaction reads:
// a first deployment parks A in the retry topic with 70 records of its key
// waiting in PostgreSQL; two members of the next deployment run; the one
// that handles A releases the key, B fails and becomes the head, and the
// member is killed while the broker refuses B's produce to the retry
// topic. The surviving member, whose recovery passes ran all along, routes
// B again and releases the rest: every record is applied once, in key
// order (with only B out of order where the deployment parks no new
// failure), and once idle the database commits fewer than 10 transactions
// a second.
func TestReliabilityHeadLeftMidRoute(t *testing.T) {
	for _, unordered := range []bool{false, true} {
		name := "ordered"
		role := "db-midroute"
		if unordered {
			name, role = "Unordered", "db-midroute-unordered"
		}
		t.Run(name, func(t *testing.T) { headLeftMidRoute(t, role, unordered) })
	}
}

func headLeftMidRoute(t *testing.T, role string, unordered bool) {
	ctx := context.Background()
	start := time.Now()
	k := testenv.KafkaT(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	url, pool := parkingDB(t)
	const topic = "payments"
	group := "g-rel-midroute-" + role
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	const behind = 70
	var want []string
	var stream []*kgo.Record
	for seq := range behind + 1 {
		v := fmt.Sprintf("k/%d", seq)
		want = append(want, v)
		stream = append(stream, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(v),
			Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(v)}}})
	}
	env := "DATABASE_URL=" + url
	waiting := func() (rows, heads int) {
		if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE head) FROM kscope_waiting`).Scan(&rows, &heads); err != nil {
			t.Fatal(err)
		}
		return rows, heads
	}

	// The first deployment: A in the retry topic, the rest waiting.
	first := startChild(t, k, "db-midroute-park", group, topic, 0, func([]byte) {}, env)
	if err := k.Produce(ctx, stream...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the records behind A waiting", func() bool { n, _ := waiting(); return n == behind })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })
	if err := first.terminate(t); err != nil {
		t.Fatalf("the first deployment exited with %v", err)
	}

	// The next deployment, two members; B's routing is refused.
	rt := retrytopic.RetryTopic(group, midRouteRung)
	pf, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: rt, Err: kerr.TopicAuthorizationFailed, Count: -1})
	if err != nil {
		t.Skip(err)
	}
	defer pf.Remove()
	members := []*child{
		startChild(t, k, role, group, topic, 0, func([]byte) {}, env),
		startChild(t, k, role, group, topic, 0, func([]byte) {}, env),
	}
	var router, survivor *child
	select {
	case <-members[0].failed:
		router, survivor = members[0], members[1]
	case <-members[1].failed:
		router, survivor = members[1], members[0]
	case <-time.After(2 * time.Minute):
		t.Fatal("no member released B")
	}
	testenv.WaitFor(t, time.Minute, "B marked as the key's head", func() bool { _, heads := waiting(); return heads == 1 })
	if err := pf.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	router.kill()
	pf.Remove()

	var got []string
	testenv.WaitFor(t, 2*time.Minute, "every record applied, none waiting", func() bool {
		got = effectOrderOf(t, pool)
		n, _ := waiting()
		return len(got) >= len(want) && n == 0
	})
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, group, topic) })

	// Idle: what the database commits over 10 s.
	xacts := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const window = 10 * time.Second
	settleStats(t, pool)
	x0 := xacts()
	time.Sleep(window) // a measurement window, not a synchronisation
	idle := float64(xacts()-x0) / window.Seconds()
	if err := survivor.terminate(t); err != nil {
		t.Fatalf("the surviving member exited with %v", err)
	}

	var rows, ids int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM effects`).Scan(&rows, &ids); err != nil {
		t.Fatal(err)
	}
	expect := want
	if unordered {
		// B travels the retry topic alone: the rest is applied in order,
		// B after A.
		drop := func(e string) bool { return e == "k/1" }
		expect, got = slices.DeleteFunc(slices.Clone(want), drop), slices.DeleteFunc(slices.Clone(got), drop)
	}
	violations := 0
	for i := 1; i < len(got); i++ {
		_, prev, _ := testenv.ParseKeyed([]byte(got[i-1]))
		if _, seq, _ := testenv.ParseKeyed([]byte(got[i])); seq < prev {
			violations++
		}
	}
	lost := max(0, len(want)-ids)
	policy := "ordered"
	if unordered {
		policy = "Unordered"
	}
	addRelRow(relRow{Scope: "DB", Records: len(want), Kills: 1, Faults: 1,
		Fault: fmt.Sprintf("a head left mid-route by a SIGKILLed member, %d records behind it (%s; idle afterwards: %.1f transactions/s)", behind-1, policy, idle),
		Lost:  lost, Dups: rows - ids, Order: violations, Duration: time.Since(start),
		Passed: rows == len(want) && ids == len(want) && violations == 0 && idle < 10})
	t.Logf("%d effects of %d records, %d order violations, idle %.1f transactions/s", rows, len(want), violations, idle)
	if rows != len(want) || ids != len(want) {
		t.Errorf("%d effects of %d identities, want each of the %d records applied once", rows, ids, len(want))
	}
	if !slices.Equal(got, expect) {
		t.Errorf("effects in the order %q, want %q", got, expect)
	}
	if idle >= 10 {
		t.Errorf("the idle pipeline's database committed %.1f transactions a second, want fewer than 10", idle)
	}
}

// settleStats closes pool's connections and waits until their backends
// exited. PostgreSQL (15 and later) adds a backend's transactions to
// pg_stat_database when it flushes its statistics: at most once a second
// while it works, and up to 10 s after it fell idle. Without this, the
// queries the test ran just before a measurement of what the database
// commits would land in it (the test's own polling, counted late: 11
// transactions a second instead of 5 on a loaded machine). A backend
// flushes as it exits.
func settleStats(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	var pids []uint32
	for _, c := range pool.AcquireAllIdle(ctx) {
		pids = append(pids, c.Conn().PgConn().PID())
		c.Release()
	}
	pool.Reset()
	testenv.WaitFor(t, time.Minute, "the test's connections to the database closed", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}

// effectOrderOf returns the effects as "key/seq", in the order applied.
func effectOrderOf(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT key || '/' || seq FROM effects ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}
