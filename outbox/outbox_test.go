package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/internal/testmain"
	"github.com/kscope-dev/kscope/outbox"
	"github.com/kscope-dev/kscope/retrytopic"
)

// A child relay is this test binary started again with childEnv set: it
// publishes every partition of the outbox until it is killed.
const childEnv = "KSCOPE_OUTBOX_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	testmain.Main(m)
}

func logger() *slog.Logger {
	if os.Getenv("KSCOPE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func runChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	parts, _ := strconv.Atoi(os.Getenv(childEnv))
	own := make([]int, parts)
	for i := range own {
		own[i] = i
	}
	r, err := outbox.New(outbox.Options{Brokers: strings.Split(os.Getenv("KAFKA_BROKERS"), ","), Pool: pool,
		Partitions: parts, OwnPartitions: own, BatchSize: 7, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("READY")
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// setup returns a Kafka backend with the output topic and a migrated
// database.
func setup(t *testing.T) (*testenv.Kafka, *pgxpool.Pool, string) {
	t.Helper()
	k := testenv.KafkaT(t)
	if err := k.CreateTopic(context.Background(), "payments.booked", 3); err != nil {
		t.Fatal(err)
	}
	url := testenv.DatabaseT(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := outbox.Migrate(context.Background(), pool, ""); err != nil {
		t.Fatal(err)
	}
	return k, pool, url
}

func runRelay(t *testing.T, o outbox.Options) (*outbox.Relay, func() error) {
	t.Helper()
	r, err := outbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var once sync.Once
	var rerr error
	stop := func() error {
		once.Do(func() {
			cancel()
			rerr = <-errc
		})
		return rerr
	}
	t.Cleanup(func() { stop() })
	return r, stop
}

// published reads the output topic read_committed and returns each
// record's value in the order read, per key.
func published(t *testing.T, k *testenv.Kafka) (byKey map[string][]string, ids map[string]int) {
	t.Helper()
	byKey, ids = map[string][]string{}, map[string]int{}
	for _, r := range k.ReadAll(t, "payments.booked") {
		byKey[string(r.Key)] = append(byKey[string(r.Key)], string(r.Value))
		ids[testenv.Header(r, retrytopic.HeaderID)]++
	}
	return byKey, ids
}

// The visibility hazard: a row is given its sequence number when it is
// inserted, but becomes visible when its transaction commits. A second
// writer to the same partition waits for the first, so a sequence number
// is never visible before the ones below it, and the relay neither skips
// nor reorders a row whose transaction committed late.
func TestInterleavedCommitsArePublishedInCommitOrder(t *testing.T) {
	ctx := context.Background()
	k, pool, _ := setup(t)
	w := outbox.Writer{Partitions: 1}
	_, _ = runRelay(t, outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0}, Logger: logger(), PollInterval: 20 * time.Millisecond})

	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx) //nolint:errcheck
	if _, err := w.Add(ctx, tx1, &kgo.Record{Topic: "payments.booked", Key: []byte("a"), Value: []byte("first-inserted")}); err != nil {
		t.Fatal(err)
	}
	// The second writer inserts after the first and tries to commit
	// before it: it waits on the partition's sequence until tx1 ends.
	second := make(chan error, 1)
	go func() {
		second <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.Add(ctx, tx, &kgo.Record{Topic: "payments.booked", Key: []byte("b"), Value: []byte("second-inserted")})
			return err
		})
	}()
	testenv.WaitFor(t, 10*time.Second, "the second writer waiting for the first", func() bool {
		var waiting int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted`).Scan(&waiting)
		return waiting > 0
	})
	// A third transaction on another partition of a wider outbox is not
	// held up.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Writer{Outbox: "other", Partitions: 1}.Add(ctx, tx, &kgo.Record{Topic: "payments.booked", Key: []byte("c"), Value: []byte("other-outbox")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "both records published and pruned", func() bool {
		var left int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM kscope_outbox WHERE outbox = 'default'`).Scan(&left)
		return left == 0
	})
	// Sequence numbers follow commit order; the two keys may be in
	// different Kafka partitions, so the records are compared by them.
	var got []string
	for _, r := range k.ReadAll(t, "payments.booked") {
		got = append(got, string(r.Value)+"@"+testenv.Header(r, retrytopic.HeaderID))
	}
	slices.SortFunc(got, func(a, b string) int {
		_, x, _ := strings.Cut(a, "@")
		_, y, _ := strings.Cut(b, "@")
		return strings.Compare(x, y)
	})
	want := []string{"first-inserted@default/0/1", "second-inserted@default/0/2"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("published %v, want %v", got, want)
	}
}

// writeStream adds n records over keys in transactions of a few records
// each, the value of each "<key>/<tag><i>" with i counting per key; it
// returns the values per key in commit order.
func writeStream(t *testing.T, pool *pgxpool.Pool, w outbox.Writer, tag string, keys, n int) map[string][]string {
	t.Helper()
	ctx := context.Background()
	want := map[string][]string{}
	next := map[string]int{}
	for i := 0; i < n; {
		var vals []string
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			vals = vals[:0]
			for j := 0; j < 1+i%4 && i+j < n; j++ {
				key := fmt.Sprintf("k%02d", (i+j)%keys)
				v := fmt.Sprintf("%s/%s%d", key, tag, next[key]+countKey(vals, key))
				if _, err := w.Add(ctx, tx, &kgo.Record{Topic: "payments.booked", Key: []byte(key), Value: []byte(v),
					Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("text/plain")}}}); err != nil {
					return err
				}
				vals = append(vals, v)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vals {
			key, _, _ := strings.Cut(v, "/")
			want[key] = append(want[key], v)
			next[key]++
		}
		i += len(vals)
	}
	return want
}

func countKey(vals []string, key string) int {
	n := 0
	for _, v := range vals {
		if strings.HasPrefix(v, key+"/") {
			n++
		}
	}
	return n
}

// checkExactlyOnce compares what a read_committed reader sees with what
// was written: every record once, each key's in commit order, every
// identity once.
func checkExactlyOnce(t *testing.T, k *testenv.Kafka, want map[string][]string) {
	t.Helper()
	got, ids := published(t, k)
	for key, vs := range want {
		if strings.Join(got[key], " ") != strings.Join(vs, " ") {
			t.Errorf("key %s published\n%v\nwant\n%v", key, got[key], vs)
		}
	}
	for id, n := range ids {
		if n != 1 || id == "" {
			t.Errorf("identity %q published %d times", id, n)
		}
	}
}

// Relays killed with SIGKILL at random moments while services write: a
// read_committed reader (kscope's and kcat) sees every record exactly
// once, each key's in the order its transactions committed.
func TestRelayKillLoopExactlyOnce(t *testing.T) {
	ctx := context.Background()
	k, pool, url := setup(t)
	const parts = 4
	w := outbox.Writer{Partitions: parts}
	start := func() *exec.Cmd { return startChild(t, k, url, parts) }
	want := map[string][]string{}
	write := func(round int) {
		for key, vs := range writeStream(t, pool, w, fmt.Sprint("r", round, "-"), 20, 60) {
			want[key] = append(want[key], vs...)
		}
	}
	publishedCount := func() int64 {
		var n int64
		_ = pool.QueryRow(ctx, `SELECT coalesce(sum(next_seq - 1), 0) - (SELECT count(*) FROM kscope_outbox) FROM kscope_outbox_sequences`).Scan(&n)
		return n
	}
	// Each relay is killed once it has published part of the rows
	// written while it ran.
	const kills = 10
	for i := range kills {
		cmd := start()
		before := publishedCount()
		write(i)
		testenv.WaitFor(t, time.Minute, fmt.Sprintf("relay %d publishing", i), func() bool { return publishedCount() > before })
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait() //nolint:errcheck // killed
	}
	write(kills)
	cmd := start()
	testenv.WaitFor(t, time.Minute, "every row published and pruned", func() bool {
		var left int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM kscope_outbox`).Scan(&left)
		return left == 0
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the last relay's exit after SIGTERM: %v", err)
	}
	checkExactlyOnce(t, k, want)
	checkKcat(t, k, 60*(kills+1))
}

// checkKcat counts the records a librdkafka read_committed reader sees.
func checkKcat(t *testing.T, k *testenv.Kafka, n int) {
	t.Helper()
	if _, err := exec.LookPath("kcat"); err != nil {
		t.Fatal("kcat is not installed (Debian: apt-get install kcat); .ci/run installs it")
	}
	out, err := exec.Command("kcat", "-C", "-b", strings.Join(k.Brokers, ","), "-t", "payments.booked", "-e", "-q",
		"-X", "isolation.level=read_committed", "-f", "%k %s\n").Output()
	if err != nil {
		t.Fatalf("kcat: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	seen := map[string]bool{}
	for _, l := range lines {
		if seen[l] {
			t.Errorf("kcat read_committed saw %q twice", l)
		}
		seen[l] = true
	}
	if len(seen) != n {
		t.Errorf("kcat read_committed saw %d distinct records, want %d", len(seen), n)
	}
}

// Two relays that both take a partition (a zombie and its successor): the
// later one fences the earlier, whose open transaction is aborted, and
// nothing is published twice.
func TestRelaysSharingAPartitionFenceEachOther(t *testing.T) {
	k, pool, _ := setup(t)
	w := outbox.Writer{Partitions: 2}
	o := outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 2, OwnPartitions: []int{0, 1}, Logger: logger(), BatchSize: 5, PollInterval: 20 * time.Millisecond}
	first, stopFirst := runRelay(t, o)
	want := writeStream(t, pool, w, "a", 8, 40)
	testenv.WaitFor(t, 30*time.Second, "the first relay publishing", func() bool { return first.Stats().Published > 0 })
	second, stopSecond := runRelay(t, o)
	// Rows keep coming until the second relay has published some of them:
	// the first may publish a whole burst before the second's producers
	// have fenced it.
	batch := 0
	testenv.WaitFor(t, time.Minute, "the second relay publishing", func() bool {
		if second.Stats().Published > 0 {
			return true
		}
		batch++
		for key, vs := range writeStream(t, pool, w, fmt.Sprintf("b%d-", batch), 8, 40) {
			want[key] = append(want[key], vs...)
		}
		return false
	})
	ctx := context.Background()
	testenv.WaitFor(t, time.Minute, "every row published", func() bool {
		var left int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM kscope_outbox`).Scan(&left)
		return left == 0
	})
	if err := errors.Join(stopFirst(), stopSecond()); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, want)
}

// Relay instances in one group share the partitions; together they publish
// everything once.
func TestRelayGroupSharesPartitions(t *testing.T) {
	k, pool, _ := setup(t)
	w := outbox.Writer{Partitions: 4}
	o := outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 4, Logger: logger(), PollInterval: 20 * time.Millisecond}
	a, stopA := runRelay(t, o)
	b, stopB := runRelay(t, o)
	testenv.WaitFor(t, time.Minute, "the partitions shared", func() bool {
		return a.Stats().Partitions+b.Stats().Partitions == 4 && a.Stats().Partitions > 0 && b.Stats().Partitions > 0
	})
	want := writeStream(t, pool, w, "", 16, 200)
	ctx := context.Background()
	testenv.WaitFor(t, time.Minute, "every row published", func() bool {
		var left int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM kscope_outbox`).Scan(&left)
		return left == 0
	})
	if err := errors.Join(stopA(), stopB()); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, want)
}

// A relay whose group the broker refuses to this client stops and says
// why, rather than publishing nothing in silence; its rows stay in the
// table for a relay that is let in.
func TestRelayStopsWhenItsGroupIsRefused(t *testing.T) {
	k, pool, _ := setup(t)
	group := "kscope-outbox-refused"
	if _, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.JoinGroup, kmsg.ConsumerGroupHeartbeat}, Group: group, Err: kerr.GroupAuthorizationFailed, Count: -1}); err != nil {
		t.Skip(err) // refusing a group needs the in-process kfake cluster
	}
	const rows = 5
	writeStream(t, pool, outbox.Writer{Partitions: 2}, "", 2, rows)
	r, err := outbox.New(outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 2, Group: group, Logger: logger(), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatal("the relay was still running 30 s after its group was refused")
	}
	if !errors.Is(err, kerr.GroupAuthorizationFailed) || !strings.Contains(err.Error(), group) {
		t.Fatalf("Run returned %v, want the refusal of group %s", err, group)
	}
	var left int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM kscope_outbox`).Scan(&left); err != nil || left != rows {
		t.Fatalf("%d rows left in the outbox (%v), want all %d", left, err, rows)
	}
}

// A relay the broker refuses a partition's transactional id
// (InitProducerId, the first request of each partition's producer, is
// where the broker checks it) or its position topic stops and says what
// to grant, rather than retrying in silence while the rows wait; they
// stay in the table.
func TestRelayStopsWhenItsTransactionalIDIsRefused(t *testing.T) {
	for _, c := range []struct {
		name  string
		fault kfake.Fault
		want  string
	}{
		{"transactional id", kfake.Fault{Keys: []kmsg.Key{kmsg.InitProducerID}, Err: kerr.TransactionalIDAuthorizationFailed, Count: -1}, "kscope-outbox-default-0"},
		{"position topic", kfake.Fault{Keys: []kmsg.Key{kmsg.ListOffsets, kmsg.Fetch}, Topic: "kscope-outbox-default.positions", Err: kerr.TopicAuthorizationFailed, Count: -1}, "kscope-outbox-default.positions"},
	} {
		t.Run(c.name, func(t *testing.T) {
			k, pool, _ := setup(t)
			if _, err := k.Fault(c.fault); err != nil {
				t.Skip(err) // refusing a request needs the in-process kfake cluster
			}
			const rows = 3
			writeStream(t, pool, outbox.Writer{Partitions: 1}, "", 2, rows)
			r, err := outbox.New(outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0}, Logger: logger(), PollInterval: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = r.Run(ctx)
			if ctx.Err() != nil {
				t.Fatalf("the relay was still running 30 s after its %s was refused", c.name)
			}
			if !errors.Is(err, c.fault.Err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Run returned %v, want the refusal (%v) naming %s", err, c.fault.Err, c.want)
			}
			var left int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM kscope_outbox`).Scan(&left); err != nil || left != rows {
				t.Fatalf("%d rows left in the outbox (%v), want all %d", left, err, rows)
			}
		})
	}
}

// Bad options fail at construction with what to change.
func TestBadOptions(t *testing.T) {
	_, err := outbox.New(outbox.Options{Partitions: -1, OwnPartitions: []int{3}})
	for _, want := range []string{"Brokers", "Pool", "Partitions", "OwnPartitions"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
	// A client option that rules out transactions is refused here, not
	// when Run starts the first partition's producer.
	_, err = outbox.New(outbox.Options{Brokers: []string{"127.0.0.1:9092"}, Partitions: 1, ClientOptions: []kgo.Opt{kgo.DisableIdempotentWrite()}})
	if err == nil || !strings.Contains(err.Error(), "ClientOptions") || !strings.Contains(err.Error(), "idempotent") {
		t.Errorf("a client option that conflicts with transactions: %v", err)
	}
	if _, err := (outbox.Writer{}).Add(context.Background(), nil, &kgo.Record{}); err == nil || !strings.Contains(err.Error(), "Topic") {
		t.Errorf("a record without a topic: %v", err)
	}
}

// A relay whose position topic is ahead of its database (the outbox tables
// were recreated, here on a new database, or restored from a backup) stops
// publishing that partition and says why: publishing on would skip the
// rows numbered up to the position, and pruning would delete them
// unpublished. The rows stay in the table.
func TestRelayRefusesAPositionAheadOfTheDatabase(t *testing.T) {
	k, pool, _ := setup(t)
	ctx := context.Background()
	write := func(pool *pgxpool.Pool, n int, prefix string) {
		t.Helper()
		w := outbox.Writer{Partitions: 1}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for i := range n {
				if _, err := w.Add(ctx, tx, &kgo.Record{Topic: "payments.booked", Key: []byte("k"), Value: []byte(fmt.Sprintf("%s-%d", prefix, i))}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	rows := func(pool *pgxpool.Pool) (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM kscope_outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	o := outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, PollInterval: 20 * time.Millisecond, Logger: logger()}
	write(pool, 5, "old")
	first, stop := runRelay(t, o)
	testenv.WaitFor(t, 30*time.Second, "the first database's rows published", func() bool { return first.Stats().Published == 5 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// The outbox tables again, empty, on a new database: sequence numbers
	// start at 1 again, below the position (5).
	fresh, err := pgxpool.New(ctx, testenv.DatabaseT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fresh.Close) // after the relay stops (cleanups run last first)
	if err := outbox.Migrate(ctx, fresh, ""); err != nil {
		t.Fatal(err)
	}
	write(fresh, 3, "new")
	var logs testenv.LogBuffer
	o.Pool, o.Logger = fresh, logs.Logger()
	second, stop := runRelay(t, o)
	testenv.WaitFor(t, 30*time.Second, "the relay to halt the partition", func() bool { return second.Stats().Halted == 1 })
	write(fresh, 3, "newer") // past the position now: still not published
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := second.Stats(); st.Published != 0 {
		t.Errorf("the relay published %d rows of a database behind its position", st.Published)
	}
	if n := rows(fresh); n != 6 {
		t.Errorf("%d rows left in the outbox table, want all 6 (nothing deleted unpublished)", n)
	}
	if n := len(k.ReadAll(t, "payments.booked")); n != 5 {
		t.Errorf("%d records on the topic, want the first database's 5", n)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "has not handed out") {
		t.Errorf("the halt was not logged as an error that says why:\n%s", logs.String())
	}
}
