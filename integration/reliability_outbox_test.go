package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/outbox"
	"github.com/kscope-dev/kscope/retrytopic"
)

const relayParts = 4

// runRelayChild publishes the default outbox (relayParts partitions, all
// owned) until SIGTERM or SIGKILL.
func runRelayChild(ctx context.Context) int {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	own := make([]int, relayParts)
	for i := range own {
		own[i] = i
	}
	r, err := outbox.New(outbox.Options{Brokers: strings.Split(os.Getenv("KAFKA_BROKERS"), ","), Pool: pool,
		Partitions: relayParts, OwnPartitions: own, BatchSize: 25, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// The outbox relay under the faults it meets in production, while a
// service writes: relays killed with SIGKILL, Produce and EndTxn requests
// failing (retriable and not), and PostgreSQL restarted (immediate mode,
// like a crash). A read_committed reader (franz-go, and librdkafka's kcat)
// sees every committed row once, and each key's records in the order
// their transactions committed.
func TestReliabilityOutboxRelay(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	rounds, nKills := 120, 3
	if reliabilityLong() {
		rounds, nKills = 400, 10
	}
	k := testenv.KafkaT(t)
	const out = "payments.booked"
	if err := k.CreateTopic(ctx, out, 3); err != nil {
		t.Fatal(err)
	}
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	url, err := pg.NewDatabase(ctx, "outbox_rel")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := outbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}

	// The service: transactions of 5 records over 20 keys, one after
	// another (at least rounds of them, and on until the faults are
	// done), retried when PostgreSQL is down; want holds each key's values
	// in commit order. A commit that fails as PostgreSQL goes down may
	// have committed all the same (the server committed, the reply was
	// lost): each transaction also inserts its attempt number, and the
	// service looks it up before it counts the transaction lost, as a
	// payment service checks its idempotency key.
	if _, err := pool.Exec(ctx, `CREATE TABLE outbox_rel_attempts (n int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	w := outbox.Writer{Partitions: relayParts}
	var mu sync.Mutex
	want := map[string][]string{}
	committed := 0
	writerDone := make(chan struct{})
	stopWriting := make(chan struct{})
	go func() {
		defer close(writerDone)
		rng := rand.New(rand.NewPCG(3, 4))
		seq := map[string]int{}
		attempt := 0
		for i := 0; ; {
			if i >= rounds {
				select {
				case <-stopWriting:
					return
				default:
				}
			}
			var recs []*kgo.Record
			next := map[string]int{}
			for range 5 {
				key := fmt.Sprintf("acct-%02d", rng.IntN(20))
				n := max(seq[key], next[key]) + 1
				next[key] = n
				recs = append(recs, &kgo.Record{Topic: out, Key: []byte(key), Value: []byte(fmt.Sprintf("%s/%d", key, n))})
			}
			attempt++
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO outbox_rel_attempts (n) VALUES ($1)`, attempt); err != nil {
					return err
				}
				for _, r := range recs {
					if _, err := w.Add(ctx, tx, r); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil && !committedAnyway(ctx, pool, attempt) {
				time.Sleep(20 * time.Millisecond) // the database is restarting: the service retries
				continue
			}
			mu.Lock()
			for _, r := range recs {
				want[string(r.Key)] = append(want[string(r.Key)], string(r.Value))
			}
			committed += len(recs)
			mu.Unlock()
			for key, n := range next {
				seq[key] = n
			}
			i++
			time.Sleep(5 * time.Millisecond)
		}
	}()
	published := func() int {
		var n int
		_ = pool.QueryRow(ctx, `SELECT coalesce(sum(next_seq - 1), 0) - (SELECT count(*) FROM kscope_outbox) FROM kscope_outbox_sequences`).Scan(&n)
		return n
	}
	env := []string{"DATABASE_URL=" + url}
	var faults int64

	// SIGKILLs of relays that are publishing.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	for i := range nKills {
		c := startChild(t, k, "outbox-relay", "-", out, 0, func([]byte) {}, env...)
		before := published()
		testenv.WaitFor(t, time.Minute, fmt.Sprintf("relay %d publishing", i+1), func() bool { return published() > before+10 })
		time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond) // a random moment, not a synchronisation
		c.kill()
	}
	relay := startChild(t, k, "outbox-relay", "-", out, 0, func([]byte) {}, env...)

	// Produce and EndTxn failures: retriable ones the client retries, and
	// a record rejected outright, which aborts the transaction (published
	// again). Only kfake fails on request.
	if k.Cluster != nil {
		h, err := k.Fault(
			kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: out, Err: kerr.NotEnoughReplicas, Count: 3},
			kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: out, Err: kerr.InvalidRecord, Count: 2},
			kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.CoordinatorLoadInProgress, Count: 3},
		)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		if err := h.Wait(wctx, 8); err != nil {
			t.Logf("broker faults hit %d of 8 times", h.Hits())
		}
		cancel()
		faults += int64(h.Hits())
		h.Remove()
	}

	// PostgreSQL crashes and comes back while both write and publish
	// (the local server only: a DATABASE_URL server is not ours to
	// restart).
	before := published()
	testenv.WaitFor(t, time.Minute, "publishing before the restart", func() bool { return published() > before+10 })
	restarted := pg.Kind == "local"
	if restarted {
		if err := pg.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		faults++
	}

	close(stopWriting)
	<-writerDone
	testenv.WaitFor(t, 2*time.Minute, "every row published and pruned", func() bool {
		var left int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM kscope_outbox`).Scan(&left)
		return err == nil && left == 0
	})
	if err := relay.terminate(t); err != nil {
		t.Errorf("the last relay's exit after SIGTERM: %v", err)
	}

	// What read_committed readers see.
	got := map[string][]string{}
	ids := map[string]int{}
	for _, r := range k.ReadAll(t, out) {
		got[string(r.Key)] = append(got[string(r.Key)], string(r.Value))
		ids[testenv.Header(r, retrytopic.HeaderID)]++
	}
	mu.Lock()
	defer mu.Unlock()
	lost, dups, order := 0, 0, 0
	for key, vs := range want {
		seen := map[string]int{}
		for _, v := range got[key] {
			seen[v]++
		}
		for _, v := range vs {
			switch n := seen[v]; {
			case n == 0:
				lost++
			case n > 1:
				dups += n - 1
			}
		}
		if !slicesEqualDedup(got[key], vs) {
			order++
		}
	}
	kcat := kcatCount(t, k, out)
	t.Logf("%d records in %d transactions, %d kills, %d faults (broker errors; PostgreSQL restarted: %v): %d read, %d lost, %d duplicates, %d keys out of order; kcat read_committed saw %d",
		committed, committed/5, nKills, faults, restarted, len(ids), lost, dups, order, kcat)
	addRelRow(relRow{Scope: "outbox", Records: committed, Kills: int64(nKills), Faults: faults,
		Fault: "outbox relay: SIGKILLs, Produce and EndTxn errors, PostgreSQL restart (read_committed, kcat)",
		Lost:  lost, Dups: dups, Order: order, Duration: time.Since(start),
		Passed: lost == 0 && dups == 0 && order == 0 && kcat == committed})
	if lost != 0 || dups != 0 || order != 0 {
		t.Errorf("%d lost, %d duplicates, %d keys out of commit order", lost, dups, order)
	}
	if kcat != committed {
		t.Errorf("kcat read_committed saw %d distinct records, want %d", kcat, committed)
	}
}

// committedAnyway reports whether the writer's transaction attempt, whose
// commit failed, committed all the same; it asks until PostgreSQL answers
// (it is restarting) or ctx ends.
func committedAnyway(ctx context.Context, pool *pgxpool.Pool, attempt int) bool {
	for ctx.Err() == nil {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_rel_attempts WHERE n = $1`, attempt).Scan(&n)
		if err == nil {
			return n == 1
		}
		time.Sleep(20 * time.Millisecond) // the database is restarting: ask again
	}
	return false
}

// slicesEqualDedup reports whether got, with repeats of a value dropped,
// is want.
func slicesEqualDedup(got, want []string) bool {
	seen := map[string]bool{}
	var g []string
	for _, v := range got {
		if !seen[v] {
			seen[v] = true
			g = append(g, v)
		}
	}
	if len(g) != len(want) {
		return false
	}
	for i := range g {
		if g[i] != want[i] {
			return false
		}
	}
	return true
}

// kcatCount counts the distinct records librdkafka sees in topic with
// isolation.level=read_committed.
func kcatCount(t *testing.T, k *testenv.Kafka, topic string) int {
	t.Helper()
	if _, err := exec.LookPath("kcat"); err != nil {
		t.Fatal("kcat is not installed (Debian: apt-get install kcat); .ci/run installs it")
	}
	b, err := exec.Command("kcat", "-C", "-b", strings.Join(k.Brokers, ","), "-t", topic, "-e", "-q",
		"-X", "isolation.level=read_committed", "-f", "%k %s\n").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("kcat: %v: %s", err, ee.Stderr)
		}
		t.Fatalf("kcat: %v", err)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l != "" {
			seen[l] = true
		}
	}
	return len(seen)
}
