package kscopetest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/kscopetest"
	"github.com/kscope-dev/kscope/txn"
)

const leaveEnv = "KSCOPETEST_LEAVE_CHILD"

func ordersPipeline() kscopetest.DBPipeline {
	return kscopetest.DBPipeline{
		Handler: dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			var order struct{ ID string }
			if err := json.Unmarshal(r.Value, &order); err != nil {
				return consumer.DecodeError(err)
			}
			_, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, order.ID)
			return err
		}),
		Schema:      `CREATE TABLE orders (id text)`,
		Valid:       func(i int) *kgo.Record { return &kgo.Record{Value: []byte(fmt.Sprintf(`{"ID":"o-%d"}`, i))} },
		Undecodable: func() *kgo.Record { return &kgo.Record{Value: []byte("not json")} },
		Effects: func(ctx context.Context, db *pgxpool.Pool) (n int, err error) {
			err = db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
			return n, err
		},
	}
}

// The kit twice in a row against one broker (KAFKA_BROKERS) and one
// PostgreSQL (DATABASE_URL), as a service's CI with `kscope dev` and a
// shared database runs it: both runs pass, and neither leaves a topic, a
// group or a database behind.
func TestKitTwiceAgainstSharedServersLeavesNothing(t *testing.T) {
	if os.Getenv(leaveEnv) != "" {
		return
	}
	if os.Getenv("KAFKA_BROKERS") != "" || os.Getenv("DATABASE_URL") != "" {
		t.Skip("this test starts the shared servers itself")
	}
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	// The kit's server is per test binary: this test points it at pg for
	// its own runs, and lets the next test start its own again.
	testenv.StopShared()
	defer testenv.StopShared()
	t.Setenv("KAFKA_BROKERS", strings.Join(cluster.ListenAddrs(), ","))
	t.Setenv("DATABASE_URL", pg.URL)
	databases := func() []string {
		conn, err := pgx.Connect(ctx, pg.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, `SELECT datname FROM pg_database ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	before := databases()
	for run := range 2 {
		t.Run(fmt.Sprint("run", run+1), func(t *testing.T) {
			if rep := kscopetest.DB(t, ordersPipeline()); !rep.Held() {
				t.Fatalf("run %d: %+v", run+1, rep)
			}
		})
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for tp := range topics {
		if strings.HasPrefix(tp, "kt-") {
			t.Errorf("topic %s left behind", tp)
		}
	}
	groups, err := adm.ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups.Groups() {
		if strings.HasPrefix(g, "kt-") {
			t.Errorf("group %s left behind", g)
		}
	}
	if after := databases(); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Errorf("databases before %v, after %v", before, after)
	}
}

// A test binary that uses the kit with no DATABASE_URL starts a PostgreSQL
// server; kscopetest.Main stops it and removes its data directory when the
// tests end, whether they pass or fail.
func TestMainStopsTheServerItStarted(t *testing.T) {
	if m := os.Getenv(leaveEnv); m == "broken" {
		return
	} else if m != "" {
		// The child: one scenario's worth of kit, on the server it starts.
		kscopetest.DB(t, ordersPipeline())
		if os.Getenv(leaveEnv) == "fail" {
			t.Fatal("failing on purpose: the server must be stopped all the same")
		}
		return
	}
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("with DATABASE_URL the kit starts no server")
	}
	for _, mode := range []string{"pass", "fail"} {
		// The server runs as the postgres user: its temporary directory
		// must be one that user can enter.
		tmp, err := os.MkdirTemp("", "kscopetest-main-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(tmp) })
		if err := os.Chmod(tmp, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestMainStopsTheServerItStarted$", "-test.count=1")
		cmd.Env = append(os.Environ(), leaveEnv+"="+mode, "TMPDIR="+tmp)
		out, err := cmd.CombinedOutput()
		if (err == nil) != (mode == "pass") {
			t.Fatalf("child (%s): %v\n%s", mode, err, out)
		}
		left, _ := filepath.Glob(filepath.Join(tmp, "kscope-pg-*"))
		if len(left) > 0 {
			t.Errorf("child (%s) left PostgreSQL data directories: %v", mode, left)
		}
		if ps, _ := exec.Command("pgrep", "-f", tmp).Output(); len(strings.TrimSpace(string(ps))) > 0 {
			t.Errorf("child (%s) left processes running on %s: %s", mode, tmp, ps)
		}
	}
}

// A broken pipeline (its handler fails every record) fails its scenarios
// as soon as their outcome is decided, saying what the kit saw, instead of
// waiting a minute each for a condition that can no longer come true.
func TestBrokenPipelineFailsFastAndSaysWhy(t *testing.T) {
	if os.Getenv(leaveEnv) == "broken" {
		p := ordersPipeline()
		p.Handler = dbscope.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Record) error {
			return consumer.Terminal(errors.New("orders table is read-only"))
		})
		kscopetest.DB(t, p)
		return
	}
	if os.Getenv(leaveEnv) != "" {
		return
	}
	start := time.Now()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenPipelineFailsFastAndSaysWhy$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), leaveEnv+"=broken")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the kit passed a pipeline whose handler fails every record:\n%s", out)
	}
	// Decided, not timed out: no scenario waited for its minute (on kfake
	// the whole run takes seconds; on Apache Kafka each scenario also
	// starts a broker).
	if strings.Contains(string(out), "timed out waiting for") {
		t.Errorf("a scenario of the broken pipeline waited for its timeout (the run took %v):\n%s", time.Since(start), out)
	}
	for _, want := range []string{"every record was done without 10 effects", "the handler's last error: orders table is read-only", "dead-letter records"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
}

// A broken Kafka-scope pipeline fails its scenarios as soon as their
// outcome is decided, saying what the kit saw: a handler that rejects every
// record (all dead-lettered, no outputs), and one that emits to a topic
// that does not exist (every transaction aborts).
func TestBrokenKafkaPipelineFailsFastAndSaysWhy(t *testing.T) {
	switch os.Getenv(leaveEnv) {
	case "kafka-rejects":
		kscopetest.Kafka(t, kscopetest.KafkaPipeline{
			Handler: txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error {
				return consumer.Terminal(errors.New("pricing service says no"))
			}),
			OutputTopics: []string{"kt-broken-out"}, OutputsPerInput: 1,
			Valid: func(i int) *kgo.Record { return &kgo.Record{Value: []byte(fmt.Sprint(i))} },
		})
		return
	case "kafka-missing-topic":
		kscopetest.Kafka(t, kscopetest.KafkaPipeline{
			Handler: txn.HandlerFunc(func(_ context.Context, r *consumer.Record, out txn.Emitter) error {
				out.Emit(&kgo.Record{Topic: "kt-no-such-topic", Value: r.Value})
				return nil
			}),
			// The client gives up on a topic that does not exist after
			// one metadata refresh, not four five seconds apart (its
			// defaults): each aborted transaction then takes about a
			// second instead of eighteen.
			Config: func(c consumer.Config) consumer.Config {
				c.ClientOptions = append(c.ClientOptions, kgo.UnknownTopicRetries(1), kgo.MetadataMinAge(250*time.Millisecond))
				return c
			},
			OutputTopics: []string{"kt-broken-out"}, OutputsPerInput: 1,
			Valid: func(i int) *kgo.Record { return &kgo.Record{Value: []byte(fmt.Sprint(i))} },
		})
		return
	case "":
	default:
		return
	}
	for _, c := range []struct {
		mode, scenarios string
		want            []string
	}{
		// Two scenarios of the eight: on Apache Kafka each starts a
		// broker of its own, and all eight took two minutes.
		{"kafka-rejects", "/^(success_then_commit|batch_partial_failure)$", []string{"0 outputs and", "the handler's last error: pricing service says no", "dead-letter records"}},
		// Two scenarios: each waits for two aborts.
		{"kafka-missing-topic", "/^(success_then_commit|batch_partial_failure)$", []string{"transactions in a row aborted", "kt-no-such-topic does not exist", "batch_partial_failure"}},
	} {
		t.Run(c.mode, func(t *testing.T) {
			start := time.Now()
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenKafkaPipelineFailsFastAndSaysWhy$"+c.scenarios, "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), leaveEnv+"="+c.mode)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the kit passed a broken pipeline:\n%s", out)
			}
			if strings.Contains(string(out), "timed out waiting for") {
				t.Errorf("a scenario of the broken pipeline waited for its timeout (the run took %v):\n%s", time.Since(start), out)
			}
			for _, want := range c.want {
				if !strings.Contains(string(out), want) {
					t.Errorf("the report lacks %q:\n%s", want, out)
				}
			}
		})
	}
}
