package testenv

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) {
	code := m.Run()
	StopShared()
	os.Exit(code)
}

func TestDatabasesAreSeparate(t *testing.T) {
	ctx := context.Background()
	a, b := DatabaseT(t), DatabaseT(t)
	if a == b {
		t.Fatal("two calls returned one database")
	}
	for _, u := range []string{a, b} {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "CREATE TABLE only_here (id int)"); err != nil {
			t.Fatalf("%s: %v", redact(u), err)
		}
		conn.Close(ctx)
	}
}

func TestNoPostgresErrorNamesTheThreeWays(t *testing.T) {
	for _, want := range []string{"DATABASE_URL", "apt-get install postgresql", "KSCOPE_TEST_CONTAINERS=1"} {
		if !strings.Contains(ErrNoPostgres.Error(), want) {
			t.Fatalf("ErrNoPostgres does not mention %s: %v", want, ErrNoPostgres)
		}
	}
}

func TestKafkaBackend(t *testing.T) {
	ctx := context.Background()
	k := KafkaT(t)
	if err := k.CreateTopic(ctx, "t", 3); err != nil {
		t.Fatal(err)
	}
	k.ProduceKeyed(t, "t", 3, 2)
	ends, err := k.EndOffsets(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ends {
		n += e
	}
	if len(ends) != 3 || n != 6 {
		t.Fatalf("end offsets %v, want 6 records over 3 partitions", ends)
	}
	if k.Kind == "kfake" {
		if _, err := k.Fault(); err != nil {
			t.Fatal(err)
		}
	}
}

// Each test gets a broker no other test used, on every backend this
// process starts, although on Apache Kafka the next test's broker starts
// ahead: a topic one test made is not on the next test's broker.
func TestEachTestHasABrokerOfItsOwn(t *testing.T) {
	if kind, _ := KafkaKind(); kind == "external" || kind == "container" {
		t.Skipf("the %s backend is one cluster for every test", kind)
	}
	ctx := context.Background()
	var seen []string
	for i := range 3 {
		k := KafkaT(t)
		seen = append(seen, strings.Join(k.Brokers, ","))
		topics, err := k.Admin().ListTopics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if topics.Has("mine") {
			t.Fatalf("broker %d (%s) has the topic an earlier test's broker made", i, seen[i])
		}
		if err := k.CreateTopic(ctx, "mine", 1); err != nil {
			t.Fatal(err)
		}
		if i > 0 && slices.Contains(seen[:i], seen[i]) {
			t.Fatalf("broker %d is at %s, as an earlier one", i, seen[i])
		}
	}
}

func TestRedactHidesPassword(t *testing.T) {
	if got := redact("postgres://u:secret@h:5432/db"); strings.Contains(got, "secret") {
		t.Fatalf("redact left the password: %s", got)
	}
}

// TestApacheKafkaCluster kills and restarts brokers of a 3-node Apache
// Kafka cluster: acknowledged writes survive the leader's death, the
// coordinators can be found, and a restarted broker rejoins. It runs when
// KSCOPE_KAFKA=apache (make test-kafka).
func TestApacheKafkaCluster(t *testing.T) {
	if kind, _ := KafkaKind(); kind != "apache" {
		t.Skipf("the Apache Kafka backend is selected with %s=apache", KafkaEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tmpBefore := jvmTempFiles(t)
	k := ApacheKafkaT(t, ApacheOptions{Nodes: 3})
	c := k.Apache
	if k.Kind != "apache" || len(k.Brokers) != 3 {
		t.Fatalf("kind %s with brokers %v, want apache with 3", k.Kind, k.Brokers)
	}
	if err := k.CreateTopic(ctx, "ha", 1); err != nil {
		t.Fatal(err)
	}
	md, err := k.Admin().Metadata(ctx, "ha")
	if err != nil {
		t.Fatal(err)
	}
	if p := md.Topics["ha"].Partitions[0]; len(p.Replicas) != 3 {
		t.Fatalf("partition replicas %v, want 3", p.Replicas)
	}
	k.ProduceKeyed(t, "ha", 2, 5)

	leader, err := c.Leader(ctx, "ha", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killing leader %d", leader)
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	if c.Running(leader) {
		t.Fatalf("node %d still runs after Kill", leader)
	}
	WaitFor(t, time.Minute, "a new leader", func() bool {
		l, err := c.Leader(ctx, "ha", 0)
		return err == nil && l != leader && l > 0
	})
	// With two of three replicas in sync, acks=all writes go on.
	k.ProduceKeyed(t, "ha", 2, 5)
	if n := len(k.ReadAll(t, "ha")); n != 20 {
		t.Fatalf("read %d records after the leader was killed, want 20", n)
	}
	gc, err := c.GroupCoordinator(ctx, "some-group")
	if err != nil || gc == leader {
		t.Fatalf("group coordinator %d (%v), want a live node", gc, err)
	}
	tc, err := c.TxnCoordinator(ctx, "some-txn")
	if err != nil || tc == leader {
		t.Fatalf("transaction coordinator %d (%v), want a live node", tc, err)
	}

	if err := c.Restart(ctx, leader); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, time.Minute, "the restarted broker back in the ISR", func() bool {
		md, err := k.Admin().Metadata(ctx, "ha")
		return err == nil && len(md.Topics["ha"].Partitions[0].ISR) == 3
	})
	if err := c.Restart(ctx, leader); err == nil {
		t.Fatal("Restart of a running node did not fail")
	}

	k.Close()
	for _, id := range []int32{1, 2, 3} {
		if c.Running(id) {
			t.Errorf("node %d still runs after Close", id)
		}
	}
	if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
		t.Errorf("the cluster's directory %s is still there after Close (%v)", c.Dir, err)
	}
	// The nodes' JVMs (the storage formats, the starts, a restart after a
	// kill) leave no file in the system's temporary directory.
	for f := range jvmTempFiles(t) {
		if !tmpBefore[f] {
			t.Errorf("%s is left in the system's temporary directory after Close", f)
		}
	}
}

// jvmTempFiles lists what a JVM leaves in the system's temporary
// directory: the native libraries snappy-java unpacks there, and the
// performance-data files under hsperfdata_<user>.
func jvmTempFiles(t *testing.T) map[string]bool {
	t.Helper()
	files := map[string]bool{}
	tmp := os.TempDir()
	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch name := e.Name(); {
		case strings.HasPrefix(name, "snappy-"):
			files[filepath.Join(tmp, name)] = true
		case strings.HasPrefix(name, "hsperfdata_"):
			sub, _ := os.ReadDir(filepath.Join(tmp, name))
			for _, f := range sub {
				files[filepath.Join(tmp, name, f.Name())] = true
			}
		}
	}
	return files
}

func TestKafkaKindFollowsTheEnvironment(t *testing.T) {
	for _, tc := range []struct{ brokers, kafka, want string }{
		{"", "", "kfake"},
		{"", "kfake", "kfake"},
		{"", "apache", "apache"},
		{"127.0.0.1:9092", "apache", "external"},
		{"", "redpanda", ""},
	} {
		t.Setenv("KAFKA_BROKERS", tc.brokers)
		t.Setenv(KafkaEnv, tc.kafka)
		t.Setenv("KSCOPE_TEST_CONTAINERS", "")
		got, err := KafkaKind()
		if tc.want == "" {
			if err == nil || !strings.Contains(err.Error(), "apache or kfake") {
				t.Errorf("%s=%q: got %q, %v; want an error naming the choices", KafkaEnv, tc.kafka, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("KAFKA_BROKERS=%q %s=%q: got %q, %v; want %q", tc.brokers, KafkaEnv, tc.kafka, got, err, tc.want)
		}
	}
}
