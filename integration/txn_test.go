package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// runTxnChild runs a Kafka-scope pipeline: every input becomes two outputs
// on topic "<input topic>.out", "<value>#a" and "<value>#b". Its
// transactional id is stable, as a restarted member's is, so each restart
// fences the previous incarnation. With versions, the records' "version"
// headers are checked against the changelog.
func runTxnChild(ctx context.Context, cfg consumer.Config, maxDelay time.Duration, role string) int {
	out := cfg.Topics[0] + ".out"
	// A child named in its environment (several at once) has a
	// transactional id of its own, which its restarts under the name keep.
	o := txn.Options{TransactionalID: cfg.Group + "-child" + os.Getenv(childNameEnv), CommitInterval: 50 * time.Millisecond, MaxRecords: 300}
	switch role {
	case "txn-versions":
		o.Versions = &sequence.Config{}
	case "txn-dedupe":
		o.Dedupe = &txn.DedupeOptions{}
	}
	r, err := txn.New(cfg, o,
		txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, em txn.Emitter) error {
			if maxDelay > 0 {
				time.Sleep(rand.N(maxDelay))
			}
			for _, s := range []string{"a", "b"} {
				em.Emit(&kgo.Record{Topic: out, Key: r.Key, Value: []byte(string(r.Value) + "#" + s)})
			}
			return nil
		}))
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

// A Kafka-scope child is killed with SIGKILL at random moments 20 times
// while 20,000 inputs flow. A read_committed reader sees every input's
// outputs exactly once, and nothing else; kcat (librdkafka, read_committed)
// sees the same.
func TestTxnSurvivesKillLoop(t *testing.T) {
	k := testenv.KafkaT(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	ctx := context.Background()
	const in, group, total, kills = "orders", "g-txn-kill", 20_000, 20
	for _, topic := range []string{in, in + ".out"} {
		if err := k.CreateTopic(ctx, topic, 4); err != nil {
			t.Fatal(err)
		}
	}
	// The producer writes while the kills happen, staying ahead of the
	// committed offsets.
	produced := make(chan error, 1)
	go func() {
		for i := 0; i < total; i += 1000 {
			for committedSumQuiet(k, group, in) < int64(i-5000) {
				time.Sleep(time.Millisecond)
			}
			var recs []*kgo.Record
			for j := i; j < i+1000; j++ {
				recs = append(recs, &kgo.Record{Topic: in, Key: []byte(fmt.Sprintf("c%03d", j%97)), Value: []byte(fmt.Sprintf("o%05d", j))})
			}
			if err := k.Produce(ctx, recs...); err != nil {
				produced <- err
				return
			}
		}
		produced <- nil
	}()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	for i := 0; i < kills; i++ {
		c := startChild(t, k, "txn", group, in, 2*time.Millisecond, func([]byte) {})
		target := committedSumQuiet(k, group, in) + int64(200+rng.IntN(800))
		testenv.WaitFor(t, time.Minute, "the child to commit", func() bool {
			return committedSumQuiet(k, group, in) >= min(target, total)
		})
		// Kill at a random moment inside the next transactions.
		time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond) // a random moment, not a synchronisation
		c.kill()
		t.Logf("kill %d: %d inputs committed", i+1, committedSumQuiet(k, group, in))
	}
	c := startChild(t, k, "txn", group, in, 0, func([]byte) {})
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "every input committed", func() bool { return k.CommittedAll(t, group, in) })
	if err := c.terminate(t); err != nil {
		t.Fatal(err)
	}

	want := make(map[string]bool, 2*total)
	for j := 0; j < total; j++ {
		want[fmt.Sprintf("o%05d#a", j)] = true
		want[fmt.Sprintf("o%05d#b", j)] = true
	}
	got := map[string]int{}
	for _, r := range k.ReadAll(t, in+".out") {
		got[string(r.Value)]++
	}
	checkOutputs(t, "Go read_committed reader", got, want)

	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat is not installed (Debian: apt-get install kcat); .ci/run installs it")
	}
	kctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	raw, err := exec.CommandContext(kctx, kcat, "-b", strings.Join(k.Brokers, ","), "-C", "-t", in+".out",
		"-o", "beginning", "-e", "-q", "-f", "%s\n", "-X", "isolation.level=read_committed").Output()
	if err != nil {
		t.Fatalf("kcat: %v", err)
	}
	kgot := map[string]int{}
	for _, v := range strings.Fields(string(raw)) {
		kgot[v]++
	}
	checkOutputs(t, "kcat read_committed", kgot, want)
}

// A versioned Kafka-scope child is killed with SIGKILL at random moments
// while records arrive with some versions swapped. Each kill loses the
// child's in-memory versions and parked records; the next one restores them
// from the changelog. Every key's outputs are its versions 1..n, in order,
// exactly once.
func TestTxnVersionsSurviveKillLoop(t *testing.T) {
	k := testenv.KafkaT(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	ctx := context.Background()
	const in, group, keys, perKey, kills = "accounts", "g-txn-versions", 50, 100, 10
	for _, topic := range []string{in, in + ".out"} {
		if err := k.CreateTopic(ctx, topic, 4); err != nil {
			t.Fatal(err)
		}
	}
	// Version v of every key; every fifth pair after the first version is
	// produced swapped, so the later version arrives first and waits in
	// the changelog.
	var recs []*kgo.Record
	for v := 1; v <= perKey; v++ {
		for key := range keys {
			recs = append(recs, &kgo.Record{Topic: in, Key: []byte(fmt.Sprintf("a%02d", key)), Value: []byte(fmt.Sprintf("a%02d:%03d", key, v)),
				Headers: []kgo.RecordHeader{{Key: "version", Value: []byte(fmt.Sprint(v))}}})
		}
	}
	for v := 2; v < perKey; v += 5 {
		for key := range keys {
			i, j := (v-1)*keys+key, v*keys+key
			recs[i], recs[j] = recs[j], recs[i]
		}
	}
	total := int64(len(recs))
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	for i := 0; i < kills; i++ {
		c := startChild(t, k, "txn-versions", group, in, 2*time.Millisecond, func([]byte) {})
		target := committedSumQuiet(k, group, in) + int64(100+rng.IntN(300))
		testenv.WaitFor(t, time.Minute, "the child to commit", func() bool {
			return committedSumQuiet(k, group, in) >= min(target, total)
		})
		time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond) // a random moment, not a synchronisation
		c.kill()
		t.Logf("kill %d: %d inputs committed", i+1, committedSumQuiet(k, group, in))
	}
	c := startChild(t, k, "txn-versions", group, in, 0, func([]byte) {})
	testenv.WaitFor(t, 3*time.Minute, "every input committed", func() bool { return k.CommittedAll(t, group, in) })
	if err := c.terminate(t); err != nil {
		t.Fatal(err)
	}
	seen := map[string][]string{}
	for _, r := range k.ReadAll(t, in+".out") {
		if strings.HasSuffix(string(r.Value), "#a") {
			seen[string(r.Key)] = append(seen[string(r.Key)], strings.TrimSuffix(string(r.Value), "#a"))
		}
	}
	for key := range keys {
		name := fmt.Sprintf("a%02d", key)
		got := seen[name]
		if len(got) != perKey {
			t.Fatalf("%s: %d outputs, want %d (each version once): %v", name, len(got), perKey, got)
		}
		for v, val := range got {
			if want := fmt.Sprintf("%s:%03d", name, v+1); val != want {
				t.Fatalf("%s: output %d is %s, want %s (versions in order, once)", name, v, val, want)
			}
		}
	}
}

// committedSumQuiet sums group's committed offsets on topic (0 before the
// group exists).
func committedSumQuiet(k *testenv.Kafka, group, topic string) int64 {
	com, err := k.CommittedOffsets(context.Background(), group, topic)
	if err != nil {
		return 0
	}
	var n int64
	for _, o := range com {
		n += o
	}
	return n
}

func checkOutputs(t *testing.T, who string, got map[string]int, want map[string]bool) {
	t.Helper()
	for v, n := range got {
		if !want[v] {
			t.Fatalf("%s: unexpected output %q", who, v)
		}
		if n != 1 {
			t.Fatalf("%s: output %q seen %d times", who, v, n)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d distinct outputs, want %d (lost some)", who, len(got), len(want))
	}
}
