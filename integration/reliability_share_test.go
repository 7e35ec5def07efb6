package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// shareRelLock is the share-group rows' acquisition lock: Apache Kafka's
// test brokers allow one of a second (group.share.min.record.lock.duration.ms).
const shareRelLock = time.Second

// shareRelMembers is how many member processes a share-group row runs, on
// a topic of shareRelPartitions partitions: more members than partitions,
// which only a share group can use.
const (
	shareRelMembers    = 4
	shareRelPartitions = 2
)

// shareRelSize is a share-group row's stream (keys × perKey records) and
// how many members it SIGKILLs: the long form's with long, else the short
// form's.
func shareRelSize(long bool) (keys, perKey, kills int) {
	if long {
		return 40, 500, 5
	}
	return 30, 100, 3
}

// TestReliabilityShareGroup runs a share group (consumer.Config.Share) of
// four member processes on a two-partition topic while members are
// SIGKILLed (and restarted) and some handlers outlive their acquisition
// lock (renewals off), in the DB scope (nothing lost, no effect twice: the
// inbox absorbs every redelivery) and in the AtLeastOnce scope (nothing
// lost; the handler calls beyond one per record are counted and reported,
// as the scope allows them). Share groups keep no per-key order across
// members, so order is not checked. With KSCOPE_KAFKA=apache, and in the
// long form, the DB row also runs on a 3-node Apache Kafka cluster, with
// the short form's stream.
func TestReliabilityShareGroup(t *testing.T) {
	kind, err := testenv.KafkaKind()
	if err != nil {
		t.Fatal(err)
	}
	for _, scope := range []string{"DB", "AtLeastOnce"} {
		t.Run(scope, func(t *testing.T) { runShareReliability(t, scope, nil, 0, reliabilityLong()) })
	}
	// Where the reliability matrix runs its 3-node cluster
	// (TestReliabilityApacheKafka): make test-kafka and make reliability.
	if kind == "apache" || kind == "kfake" && reliabilityLong() {
		t.Run("DB on 3 nodes", func(t *testing.T) {
			runShareReliability(t, "DB", testenv.ApacheKafkaT(t, testenv.ApacheOptions{Nodes: 3}), 3, false)
		})
	}
}

// shareRelRun is a running share-group row.
type shareRelRun struct {
	t            *testing.T
	k            *testenv.Kafka
	scope        string
	topic, group string
	role         string
	env          []string
	pool         *pgxpool.Pool
	total        int

	mu           sync.Mutex
	calls        map[string]int // handler calls per record value
	redeliveries atomic.Int64   // handler calls of a delivery after the first
}

// runShareReliability runs the share-group row of scope on k (a fresh
// backend when nil; nodes is its size for the report, 0 for the suite's
// backend), with the long form's stream when long, and records it.
func runShareReliability(t *testing.T, scope string, k *testenv.Kafka, nodes int, long bool) {
	start := time.Now()
	keys, perKey, kills := shareRelSize(long)
	if k == nil {
		k = testenv.KafkaT(t, kfake.BrokerConfigs(map[string]string{
			"group.share.heartbeat.interval.ms":   "100",
			"share.record.lock.sweep.interval.ms": "100",
			"group.share.record.lock.duration.ms": strconv.FormatInt(shareRelLock.Milliseconds(), 10),
		}))
	}
	name := strings.ToLower(scope)
	e := &shareRelRun{t: t, k: k, scope: scope, topic: "rel-share-" + name, group: "g-rel-share-" + name,
		role: "alo-share", total: keys * perKey, calls: map[string]int{}}
	ctx := context.Background()
	if err := k.CreateTopic(ctx, e.topic, shareRelPartitions); err != nil {
		t.Fatal(err)
	}
	if scope == "DB" {
		e.openDB()
	}
	e.env = append(e.env, shareChildLockEnv+"="+shareRelLock.String())
	if k.Kind != "kfake" {
		// Apache Kafka 4.3.1 can stop a share partition after a run of
		// late acknowledgements (docs/share-groups.md): there the members
		// renew their locks, and the slow handlers keep their records.
		e.env = append(e.env, shareChildRenewEnv+"=1")
	}
	recs := testenv.KeyedRecords(e.topic, keys, perKey)
	slow := 0
	for _, r := range recs {
		if shareSlow(r.Value) {
			slow++
		}
	}
	for i := 0; i < len(recs); i += 1000 {
		if err := k.Produce(ctx, recs[i:min(i+1000, len(recs))]...); err != nil {
			t.Fatal(err)
		}
	}
	members := make([]*child, shareRelMembers)
	for i := range members {
		members[i] = e.startMember()
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 50))
	for i := range kills {
		target := (i + 1) * e.total / (kills + 2)
		e.waitProgress(target, members)
		time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond) // a random moment, not a synchronisation
		m := i % len(members)
		members[m].kill()
		members[m] = e.startMember()
		t.Logf("kill %d: %d records done", i+1, e.progress())
	}
	e.waitDone(3 * time.Minute)
	for _, m := range members {
		if err := m.terminate(t); err != nil {
			t.Errorf("member: %v", err)
		}
	}
	e.report(start, kills, slow, nodes)
}

// openDB opens the row's database: kscope's tables and the effects table.
func (e *shareRelRun) openDB() {
	ctx := context.Background()
	url := testenv.DatabaseT(e.t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(pool.Close)
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		e.t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, effectsDDL); err != nil {
		e.t.Fatal(err)
	}
	e.pool, e.role = pool, "db-share"
	e.env = append(e.env, "DATABASE_URL="+url)
}

// startMember starts a member process.
func (e *shareRelRun) startMember() *child {
	return startChild(e.t, e.k, e.role, e.group, e.topic, time.Millisecond, func(line []byte) {
		v, delivery := parseShareLine(line)
		e.mu.Lock()
		e.calls[v]++
		e.mu.Unlock()
		if delivery > 1 {
			e.redeliveries.Add(1)
		}
	}, e.env...)
}

// progress is how many distinct records are done: applied (DB scope) or
// handled (AtLeastOnce scope).
func (e *shareRelRun) progress() int {
	if e.pool != nil {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(DISTINCT (key, seq)) FROM effects`).Scan(&n); err != nil {
			e.t.Fatal(err)
		}
		return n
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.calls)
}

// waitProgress waits until target records are done, or fails t after 3
// minutes with what the share group and its members looked like.
func (e *shareRelRun) waitProgress(target int, members []*child) {
	deadline := time.Now().Add(3 * time.Minute)
	for e.progress() < target {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after 3m0s waiting for %d records done (%d done); %s", target, e.progress(), e.describe(members))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// describe says what a stalled row saw: the members still running, the
// share group's members as the broker sees them, its start offsets and
// the topic's end offsets.
func (e *shareRelRun) describe(members []*child) string {
	running := 0
	for _, m := range members {
		select {
		case <-m.exited:
		default:
			running++
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := e.k.Admin()
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d member processes running", running, len(members))
	if gs, err := adm.DescribeShareGroups(ctx, e.group); err != nil {
		fmt.Fprintf(&b, "; describing the share group: %v", err)
	} else {
		g := gs[e.group]
		fmt.Fprintf(&b, "; the share group: state %s, %d members, err %v", g.GroupState, len(g.Members), g.Err)
	}
	if offs, err := adm.DescribeShareGroupOffsets(ctx, e.group); err != nil {
		fmt.Fprintf(&b, "; its start offsets: %v", err)
	} else {
		for _, ps := range offs[e.group].Offsets {
			for p, o := range ps {
				fmt.Fprintf(&b, "; partition %d starts at %d (lag %d)", p, o.StartOffset, o.Lag)
			}
		}
	}
	ends, _ := e.k.EndOffsets(ctx, e.topic)
	fmt.Fprintf(&b, "; the topic's end offsets: %v", ends)
	return b.String()
}

// waitDone waits until every record is done, or d passed (the report then
// counts the missing ones as lost). The members' graceful stop that
// follows lets the slow deliveries still running end (within the drain
// timeout), so that a second effect of theirs would show.
func (e *shareRelRun) waitDone(d time.Duration) {
	deadline := time.Now().Add(d)
	for e.progress() < e.total && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

// tally counts the records never done and the effects (DB scope) or
// handler calls (AtLeastOnce scope) beyond one per record.
func (e *shareRelRun) tally() (lost, dups int) {
	done := map[string]int{}
	if e.pool != nil {
		rows, err := e.pool.Query(context.Background(), `SELECT key, seq FROM effects`)
		if err != nil {
			e.t.Fatal(err)
		}
		for rows.Next() {
			var key string
			var seq int
			if err := rows.Scan(&key, &seq); err != nil {
				e.t.Fatal(err)
			}
			done[fmt.Sprintf("%s/%d", key, seq)]++
		}
		rows.Close()
	} else {
		e.mu.Lock()
		for v, n := range e.calls {
			done[v] = n
		}
		e.mu.Unlock()
	}
	for _, n := range done {
		dups += n - 1
	}
	return e.total - len(done), dups
}

// dlt counts the records in the group's dead-letter topic (records that
// ran out of deliveries: none expected).
func (e *shareRelRun) dlt() int64 {
	ends, err := e.k.EndOffsets(context.Background(), retrytopic.DLTopic(e.group))
	if err != nil {
		return 0 // no dead-letter topic: nothing was dead-lettered
	}
	var n int64
	for _, o := range ends {
		n += o
	}
	return n
}

// report records the row and fails t when a record was lost or, in the
// DB scope, applied twice.
func (e *shareRelRun) report(start time.Time, kills, slow, nodes int) {
	t := e.t
	lost, dups := e.tally()
	dead := e.dlt()
	alo := e.scope == "AtLeastOnce"
	where := ""
	if nodes > 0 {
		where = fmt.Sprintf(" (Apache Kafka, %d nodes)", nodes)
	}
	slowly := fmt.Sprintf("%d records' handlers outliving their %s lock (renewals off)", slow, shareRelLock)
	if e.k.Kind != "kfake" {
		if nodes == 0 {
			where = " (Apache Kafka)"
		}
		slowly = fmt.Sprintf("%d records' handlers running past their %s lock, which the members renew (Apache Kafka 4.3.1 stalls after late acknowledgements)", slow, shareRelLock)
	}
	fault := fmt.Sprintf("share group%s: %d members on %d partitions, %d SIGKILLed and restarted, %s: %d redeliveries, %d dead-lettered",
		where, shareRelMembers, shareRelPartitions, kills, slowly, e.redeliveries.Load(), dead)
	if alo {
		fault += fmt.Sprintf(" (at least once: %d handler calls again, allowed)", dups)
	}
	row := relRow{Scope: e.scope, Fault: fault, Records: e.total, Faults: int64(slow), Kills: int64(kills),
		Lost: lost, Dups: dups, DupsAllowed: alo, Duration: time.Since(start), Nodes: nodes}
	row.Passed = lost == 0 && (alo || dups == 0) && !t.Failed()
	addRelRow(row)
	if e.redeliveries.Load() == 0 {
		t.Errorf("no record was delivered twice: the row injected nothing")
	}
	if lost > 0 {
		t.Errorf("%d of %d records never done (%d in the dead-letter topic)", lost, e.total, dead)
	}
	if !alo && dups > 0 {
		t.Errorf("%d effects applied twice", dups)
	}
	t.Logf("%s / %s: %d records, %d lost, %d duplicates in %s", e.scope, fault, e.total, lost, dups, row.Duration.Round(time.Millisecond))
}
