package dbscope_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
)

// versioned returns a record of key with version v (a header) and value
// "key/v"; n makes its message id unique, so a repeated version is not an
// inbox duplicate.
func versioned(topic, key string, v int, n int) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(fmt.Sprintf("%s/%d", key, v)),
		Headers: []kgo.RecordHeader{
			{Key: "version", Value: []byte(fmt.Sprint(v))},
			{Key: "message-id", Value: []byte(fmt.Sprintf("%s-%d-%d", key, v, n))},
		}}
}

// appliedVersions returns each key's applied versions, in the order applied.
func appliedVersions(t testing.TB, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT key, seq FROM effects ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var k string
		var v int
		rows.Scan(&k, &v)
		out[k] = append(out[k], fmt.Sprint(v))
	}
	res := map[string]string{}
	for k, vs := range out {
		res[k] = strings.Join(vs, ",")
	}
	return res
}

func versionConfig(k *testenv.Kafka, group, topic string) consumer.Config {
	cfg := baseConfig(k, group, topic)
	cfg.Failures = retrytopic.Policy{
		Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, InPlaceAttempts: 1,
		Ladder: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}, RetryableAttempts: 1000,
	}
	return cfg
}

// In-order versions are applied; a repeated version and an older one are
// skipped as stale; the handler can read the check's result.
func TestVersionsInOrderStaleAndDuplicate(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "acct-events", "g-versions"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx,
		versioned(topic, "K", 1, 0), versioned(topic, "K", 2, 0), versioned(topic, "K", 3, 0),
		versioned(topic, "K", 3, 1), // the same version again, another message
		versioned(topic, "K", 2, 2), // an older one
		versioned(topic, "K", 4, 0)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var firsts []bool
	r, err := dbscope.New(versionConfig(k, group, topic), dbscope.Options{Pool: pool, Versions: &sequence.Config{}},
		dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			res, ok := sequence.FromContext(ctx)
			if !ok {
				return fmt.Errorf("no version check result in the handler's context")
			}
			mu.Lock()
			firsts = append(firsts, res.First)
			mu.Unlock()
			return insertEffect(ctx, tx, r)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == 6 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := appliedVersions(t, pool)["K"]; got != "1,2,3,4" {
		t.Fatalf("applied versions %s, want 1,2,3,4", got)
	}
	if st := r.Stats().DB; st.Stale != 2 || st.Applied != 4 {
		t.Fatalf("stats %+v: want 4 applied, 2 stale", st)
	}
	if fmt.Sprint(firsts) != "[true false false false]" {
		t.Fatalf("First flags seen by the handler %v", firsts)
	}
}

// Versions 1, 3, 2 arrive: 3 waits in the retry topics with its key parked,
// 2 fills the gap, then 3 is applied: 1, 2, 3. Another key is not held back.
func TestVersionGapThenFill(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "acct-events", "g-gapfill"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	r, err := dbscope.New(versionConfig(k, group, topic), dbscope.Options{Pool: pool, Versions: &sequence.Config{}},
		dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, versioned(topic, "K", 1, 0), versioned(topic, "K", 3, 0), versioned(topic, "J", 1, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the gap detected", func() bool { return r.Stats().DB.GapsDetected == 1 })
	if err := k.Produce(ctx, versioned(topic, "J", 2, 0), versioned(topic, "K", 4, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "J applied while K waits", func() bool { return appliedVersions(t, pool)["J"] == "1,2" })
	if got := appliedVersions(t, pool)["K"]; got != "1" {
		t.Fatalf("K applied %s while version 2 is missing", got)
	}
	if err := k.Produce(ctx, versioned(topic, "K", 2, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "K healed", func() bool { return appliedVersions(t, pool)["K"] == "1,2,3,4" })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats().DB; st.GapsHealed != 1 || st.GapsTimedOut != 0 {
		t.Fatalf("stats %+v: want one gap healed", st)
	}
}

// A gap that never fills goes to the DLT after GapTimeout with the expected
// and actual versions in headers; the key is released: a later record of it
// is judged on its own.
func TestVersionGapTimeout(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "acct-events", "g-gaptimeout"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	r, err := dbscope.New(versionConfig(k, group, topic), dbscope.Options{Pool: pool,
		Versions: &sequence.Config{GapTimeout: 500 * time.Millisecond}}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, versioned(topic, "K", 1, 0), versioned(topic, "K", 5, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the gap timed out", func() bool {
		return r.Stats().DB.GapsTimedOut == 1 && r.Stats().Failures.DeadLettered == 1
	})
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || testenv.Header(dlt[0], retrytopic.HeaderVersionExpected) != "2" || testenv.Header(dlt[0], retrytopic.HeaderVersionActual) != "5" {
		t.Fatalf("DLT %v", dlt)
	}
	// Released: version 2 arrives late and is applied at once.
	if err := k.Produce(ctx, versioned(topic, "K", 2, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the key released", func() bool { return appliedVersions(t, pool)["K"] == "1,2" })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// A record without a readable version is poison: it goes to the DLT with
// the reason, and the consumer keeps going.
func TestUnreadableVersionGoesToDLT(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "acct-events", "g-badversion"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	bad := versioned(topic, "K", 1, 0)
	bad.Headers[0].Value = []byte("one")
	if err := k.Produce(ctx, bad, versioned(topic, "J", 1, 0)); err != nil {
		t.Fatal(err)
	}
	r, err := dbscope.New(versionConfig(k, group, topic), dbscope.Options{Pool: pool, Versions: &sequence.Config{}}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	testenv.WaitFor(t, time.Minute, "both done", func() bool { return r.Stats().Done == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || !strings.Contains(testenv.Header(dlt[0], retrytopic.HeaderError), `header "version" is "one"`) {
		t.Fatalf("DLT %v", dlt)
	}
	if got := appliedVersions(t, pool)["J"]; got != "1" {
		t.Fatalf("J applied %q", got)
	}
}

// A rebalance while a key waits for a missing version: the new owner of the
// partitions carries on from the database; no version is applied twice and
// none is skipped.
func TestVersionGapAcrossRebalance(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "acct-events", "g-gaprebalance"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	newMember := func() *dbscope.Runner {
		cfg := versionConfig(k, group, topic)
		cfg.ClientOptions = []kgo.Opt{kgo.HeartbeatInterval(50 * time.Millisecond)}
		r, err := dbscope.New(cfg, dbscope.Options{Pool: pool, Versions: &sequence.Config{}}, dbscope.HandlerFunc(insertEffect))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := newMember()
	stopA := run(t, a)
	if err := k.Produce(ctx, versioned(topic, "K", 1, 0), versioned(topic, "K", 3, 0), versioned(topic, "K", 4, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the gap detected", func() bool { return a.Stats().DB.GapsDetected == 1 })
	b := newMember()
	stopB := run(t, b)
	testenv.WaitFor(t, time.Minute, "b to join", func() bool { return b.Stats().Assigned > 0 })
	if err := stopA(); err != nil { // every partition moves to b, mid-gap
		t.Fatal(err)
	}
	if err := k.Produce(ctx, versioned(topic, "K", 2, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "K complete", func() bool { return appliedVersions(t, pool)["K"] == "1,2,3,4" })
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	if got := appliedVersions(t, pool)["K"]; got != "1,2,3,4" {
		t.Fatalf("K applied %s", got)
	}
}

// The other gap policies: DeadLetter sends a gapped record to the DLT at
// once; Accept applies it and counts the gap; FirstMustBeOne treats a new
// key's first version other than 1 as a gap.
func TestVersionGapPolicies(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     sequence.Config
		applied string
		dlt     int
	}{
		{"dead-letter", sequence.Config{Gaps: sequence.DeadLetter}, "1,2", 2}, // 3 and then 4 are gaps
		{"accept", sequence.Config{Gaps: sequence.Accept}, "1,3,4", 0},
		{"first-must-be-one", sequence.Config{Gaps: sequence.DeadLetter, First: sequence.FirstMustBeOne}, "", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			k := testenv.KafkaT(t)
			pool := newPool(t)
			const topic, group = "acct-events", "g-gappolicy"
			if err := k.CreateTopic(ctx, topic, 1); err != nil {
				t.Fatal(err)
			}
			recs := []*kgo.Record{versioned(topic, "K", 1, 0), versioned(topic, "K", 3, 0), versioned(topic, "K", 4, 0)}
			if tc.name == "dead-letter" {
				recs[2] = versioned(topic, "K", 2, 0)
				recs = append(recs, versioned(topic, "K", 4, 0))
			}
			if tc.name == "first-must-be-one" {
				recs = []*kgo.Record{versioned(topic, "K", 2, 0), versioned(topic, "K", 3, 0), versioned(topic, "K", 5, 0)}
			}
			if err := k.Produce(ctx, recs...); err != nil {
				t.Fatal(err)
			}
			cfg := tc.cfg
			r, err := dbscope.New(versionConfig(k, group, topic), dbscope.Options{Pool: pool, Versions: &cfg}, dbscope.HandlerFunc(insertEffect))
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, r)
			testenv.WaitFor(t, time.Minute, "every record done", func() bool { return r.Stats().Done == int64(len(recs)) })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if got := appliedVersions(t, pool)["K"]; got != tc.applied {
				t.Fatalf("applied %q, want %q", got, tc.applied)
			}
			if n := len(k.ReadAll(t, retrytopic.DLTopic(group))); n != tc.dlt {
				t.Fatalf("%d DLT records, want %d", n, tc.dlt)
			}
			if tc.name == "accept" && r.Stats().DB.GapsAccepted != 1 {
				t.Fatalf("stats %+v: one gap accepted", r.Stats().DB)
			}
		})
	}
}

// Versions swapped behind a key's head: K's version 1 fails into the retry
// topics, versions 3 and 2 (in that order) and 4 wait behind it. When 1
// succeeds, the waiting records are applied in version order, so 3 does
// not wait in the retry topics for the 2 that waits behind it (which would
// hold K until GapTimeout and then dead-letter 3).
func TestSwappedVersionsWaitingBehindAHead(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "acct-events", "g-swap-behind-head"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var first atomic.Bool
	r, err := dbscope.New(versionConfig(k, group, topic), dbscope.Options{Pool: pool, Versions: &sequence.Config{GapTimeout: time.Minute}},
		dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, rec *consumer.Record) error {
			if string(rec.Value) == "K/1" && first.CompareAndSwap(false, true) {
				return consumer.Retryable(errors.New("gateway 503"))
			}
			return insertEffect(ctx, tx, rec)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, versioned(topic, "K", 1, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "version 1 in the retry topics", func() bool { return r.Stats().Failures.RetryTopic >= 1 })
	if err := k.Produce(ctx, versioned(topic, "K", 3, 0), versioned(topic, "K", 2, 0), versioned(topic, "K", 4, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "K applied in version order", func() bool { return appliedVersions(t, pool)["K"] == "1,2,3,4" })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats().DB; st.GapsTimedOut != 0 {
		t.Fatalf("stats %+v: no gap may time out", st)
	}
}

// Versions turned on while records wait behind a head: a deployment
// without Versions leaves K's version 1 in the retry topics and 2 and 3
// waiting behind it in PostgreSQL, stored without a version. The next
// deployment checks versions: when 1 is applied, 2 and 3 are released and
// applied, their versions read from their headers, not taken for stale.
func TestVersionsTurnedOnWhileRecordsWait(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "acct-events", "g-versions-on"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	r1, err := dbscope.New(versionConfig(k, group, topic), dbscope.Options{Pool: pool},
		dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, rec *consumer.Record) error {
			if string(rec.Value) == "K/1" {
				return consumer.Retryable(errors.New("gateway 503"))
			}
			return insertEffect(ctx, tx, rec)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r1)
	if err := k.Produce(ctx, versioned(topic, "K", 1, 0), versioned(topic, "K", 2, 0), versioned(topic, "K", 3, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "2 and 3 waiting behind 1", func() bool {
		_, waiting, _ := parkingRows(t, pool)
		return waiting == 2
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	r2, err := dbscope.New(versionConfig(k, group, topic), dbscope.Options{Pool: pool, Versions: &sequence.Config{}},
		dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop = run(t, r2)
	testenv.WaitFor(t, time.Minute, "1 applied and no record left waiting", func() bool {
		parked, waiting, _ := parkingRows(t, pool)
		return strings.HasPrefix(appliedVersions(t, pool)["K"], "1") && parked == 0 && waiting == 0
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := appliedVersions(t, pool)["K"]; got != "1,2,3" {
		t.Fatalf("K applied %q, want 1,2,3 (stats %+v)", got, r2.Stats().DB)
	}
}

// A record released from behind a head that finds a gap waits in the
// retry topics for the missing version, as a record that finds a gap when
// consumed does: until GapTimeout, not for the in-place attempts and
// retry budget of a failing handler. 1, 3, 5 and 2 arrive: 3 waits for 2
// in the retry topics, 5 behind 3; 2 fills the gap and 3 follows, which
// releases 5, still ahead of the 4 that comes later. With a retry budget
// of three attempts, all spent in place, 5 went to the DLT.
func TestReleasedGapWaitsForTheMissingVersion(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "acct-events", "g-released-gap"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := versionConfig(k, group, topic)
	cfg.Failures.InPlaceAttempts, cfg.Failures.RetryableAttempts = 3, 3
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool, Versions: &sequence.Config{GapTimeout: time.Hour}},
		dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, versioned(topic, "K", 1, 0), versioned(topic, "K", 3, 0), versioned(topic, "K", 5, 0), versioned(topic, "K", 2, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "3 applied and 5 released", func() bool {
		_, waiting, _ := parkingRows(t, pool)
		return appliedVersions(t, pool)["K"] == "1,2,3" && waiting == 0
	})
	if err := k.Produce(ctx, versioned(topic, "K", 4, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "4 applied", func() bool {
		return strings.HasPrefix(appliedVersions(t, pool)["K"], "1,2,3,4")
	})
	testenv.WaitFor(t, time.Minute, "5 applied or dead-lettered", func() bool {
		return appliedVersions(t, pool)["K"] == "1,2,3,4,5" || r.Stats().Failures.DeadLettered > 0
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, st := appliedVersions(t, pool)["K"], r.Stats(); got != "1,2,3,4,5" || st.Failures.DeadLettered != 0 {
		t.Fatalf("K applied %q with %d dead-lettered, want 1,2,3,4,5 and none (stats %+v)", got, st.Failures.DeadLettered, st.DB)
	}
}

// Records stored behind a head have waited for their key since they were
// stored: when the head goes to the DLT and they are released into a gap
// that never fills, their GapTimeout counts from then. K's 2 fails until
// it is dead-lettered, with 4 and 5 stored behind it (3 never comes); they
// have waited past GapTimeout (their rows made two hours old) and follow 2
// to the DLT at once, instead of one GapTimeout after another, each
// holding K for an hour.
func TestRecordsBehindAPermanentGapTimeOutTogether(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group = "acct-events", "g-gap-together"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	var give atomic.Bool // 2 fails for good once set
	r, err := dbscope.New(versionConfig(k, group, topic), dbscope.Options{Pool: pool, Versions: &sequence.Config{GapTimeout: time.Hour}},
		dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, rec *consumer.Record) error {
			if string(rec.Value) == "K/2" {
				if give.Load() {
					return consumer.Terminal(errors.New("account closed"))
				}
				return consumer.Retryable(errors.New("gateway 503"))
			}
			return insertEffect(ctx, tx, rec)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	if err := k.Produce(ctx, versioned(topic, "K", 1, 0), versioned(topic, "K", 2, 0), versioned(topic, "K", 4, 0), versioned(topic, "K", 5, 0)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "4 and 5 waiting behind 2", func() bool {
		_, waiting, _ := parkingRows(t, pool)
		return waiting == 2
	})
	if _, err := pool.Exec(ctx, `UPDATE kscope_waiting SET parked_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	give.Store(true)
	testenv.WaitFor(t, 30*time.Second, "2, 4 and 5 dead-lettered, nothing left waiting", func() bool {
		parked, waiting, _ := parkingRows(t, pool)
		return r.Stats().Failures.DeadLettered == 3 && parked == 0 && waiting == 0
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, st := appliedVersions(t, pool)["K"], r.Stats().DB; got != "1" || st.GapsTimedOut != 2 {
		t.Fatalf("K applied %q with %d gaps timed out; want 1, and 4 and 5 timed out (stats %+v)", got, st.GapsTimedOut, st)
	}
}
