package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/internal/testmain"
)

func TestMain(m *testing.M) {
	testmain.Main(m)
}

// result is what one kscope invocation printed and returned.
type result struct {
	code           int
	stdout, stderr string
}

// kscope runs the command line args in process, as main does.
func kscope(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

// want fails the test unless r exited with code and its output contains
// every one of subs.
func (r result) want(t *testing.T, code int, subs ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	all := r.stdout + r.stderr
	for _, s := range subs {
		if !strings.Contains(all, s) {
			t.Fatalf("output does not contain %q\nstdout:\n%s\nstderr:\n%s", s, r.stdout, r.stderr)
		}
	}
}

// brokers returns the --brokers flag for k.
func brokers(k *testenv.Kafka) string { return "--brokers=" + strings.Join(k.Brokers, ",") }

// produceTo writes recs to the partitions set in them.
func produceTo(t *testing.T, k *testenv.Kafka, recs ...*kgo.Record) {
	t.Helper()
	cl, err := k.Client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func createTopic(t *testing.T, k *testenv.Kafka, topic string, partitions int32) {
	t.Helper()
	if err := k.CreateTopic(context.Background(), topic, partitions); err != nil {
		t.Fatalf("creating %s: %v", topic, err)
	}
}

// readTopic reads every record of topic up to its current end offsets,
// with a deadline.
func readTopic(t *testing.T, k *testenv.Kafka, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ends, err := k.EndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(0)
	for _, e := range ends {
		want += e
	}
	cl, err := k.Client(kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for int64(len(out)) < want {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of the %d records of %s before the deadline", len(out), want, topic)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

// waitFor polls cond until it holds, or fails the test at the deadline.
func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (last error: %v)", what, err)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
	}
}

func TestHelpAndUsage(t *testing.T) {
	kscope(t, "help").want(t, exitOK, "dlt list", "dlt show", "dlt redrive", "replay", "KAFKA_BROKERS", "Examples:")
	kscope(t).want(t, exitUsage, "Commands:")
	kscope(t, "help", "dlt", "redrive").want(t, exitOK, "--to source", "does NOT remove", "-dry-run", "-rate")
	kscope(t, "dlt", "list", "-h").want(t, exitOK, "Examples:", "-brokers", "-from-offset", "-class")
	kscope(t, "dlt", "show", "--help").want(t, exitOK, "-max-value")
	kscope(t, "replay", "-h").want(t, exitOK, "--to-time", "-yes", "stop its consumers first")
	kscope(t, "dlt").want(t, exitUsage, "kscope dlt list")
	kscope(t, "dlt", "help").want(t, exitOK, "kscope dlt show")
	kscope(t, "dlt", "purge").want(t, exitUsage, `unknown subcommand "purge"`)
	kscope(t, "frobnicate").want(t, exitUsage, `unknown command "frobnicate"`)
	kscope(t, "dlt", "list", "--nope").want(t, exitUsage, "flag provided but not defined: -nope", "kscope dlt list -h")
	kscope(t, "dlt", "list", "--group", "g", "extra").want(t, exitUsage, `unexpected argument "extra"`)
	// Help spells the flags as the texts do, with two dashes.
	if r := kscope(t, "replay", "-h"); !strings.Contains(r.stdout, "\n  --group string") || strings.Contains(r.stdout, "\n  -group") {
		t.Fatalf("flags not listed as --name:\n%s", r.stdout)
	}
	kscope(t, "--version").want(t, exitOK, "kscope ", "go1.")
	kscope(t, "version").want(t, exitOK, "kscope ")
	kscope(t, "dev", "-h").want(t, exitOK, "--nodes", "--group-min-session-timeout", "--port 0")
}

func TestMissingBrokers(t *testing.T) {
	t.Setenv("KAFKA_BROKERS", "")
	for _, args := range [][]string{
		{"dlt", "list", "--group", "g"},
		{"dlt", "show", "--group", "g", "--partition", "0", "--offset", "0"},
		{"dlt", "redrive", "--group", "g", "--to", "source"},
		{"replay", "--group", "g", "--topic", "t", "--to-start"},
	} {
		kscope(t, args...).want(t, exitUsage, "no brokers given: set --brokers or KAFKA_BROKERS")
	}
}

func TestBrokersFromEnvironment(t *testing.T) {
	k := testenv.KafkaT(t)
	dlt := "env.kscope-dlt"
	createTopic(t, k, dlt, 1)
	t.Setenv("KAFKA_BROKERS", " "+strings.Join(k.Brokers, " , ")+" ")
	kscope(t, "dlt", "list", "--topic", dlt).want(t, exitOK, "0 records")
}

func TestUnreachableBrokers(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the request retry timeout")
	}
	// A port nothing listens on: the command fails and names the flag.
	r := kscope(t, "dlt", "list", "--brokers", "127.0.0.1:1", "--group", "g")
	r.want(t, exitFailure, "cannot talk to the brokers 127.0.0.1:1", "check --brokers or KAFKA_BROKERS")
}
