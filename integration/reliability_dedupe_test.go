package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// upstreamSize is the upstream-duplicates row's messages and SIGKILLs.
func upstreamSize() (messages, kills int) {
	if reliabilityLong() {
		return 10_000, 5
	}
	return 3_000, 3
}

// Upstream duplicates in the Kafka scope: a producer sends each message
// once and re-sends a fifth of them (the same message id and key, at later
// offsets, as a producer's retry or a relay does) while the member is
// killed with SIGKILL at random moments. With txn.Options.Dedupe a
// read_committed reader (franz-go, and kcat) sees each message's outputs
// exactly once: a duplicate produces nothing, whichever transaction and
// member it falls in.
func TestReliabilityUpstreamDuplicatesKafka(t *testing.T) {
	start := time.Now()
	k := testenv.KafkaT(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	ctx := context.Background()
	const in, group = "rel-dups", "g-rel-dups"
	messages, kills := upstreamSize()
	for _, topic := range []string{in, in + ".out"} {
		if err := k.CreateTopic(ctx, topic, 4); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	msg := func(j int) *kgo.Record {
		id := fmt.Sprintf("m%05d", j)
		return &kgo.Record{Topic: in, Key: fmt.Appendf(nil, "c%03d", j%97), Value: []byte(id),
			Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}}
	}
	// The stream: every message, and every fifth one again 50 to 2,000
	// messages later.
	var stream []*kgo.Record
	resend := map[int][]int{}
	for j := range messages {
		stream = append(stream, msg(j))
		if j%5 == 0 {
			at := j + 50 + rng.IntN(1950)
			resend[at] = append(resend[at], j)
		}
		for _, d := range resend[j] {
			stream = append(stream, msg(d))
		}
		delete(resend, j)
	}
	for _, ds := range resend {
		for _, d := range ds {
			stream = append(stream, msg(d))
		}
	}
	total := int64(len(stream))
	produced := make(chan error, 1)
	go func() {
		for i := 0; i < len(stream); i += 500 {
			for committedSumQuiet(k, group, in) < int64(i-3000) {
				time.Sleep(time.Millisecond)
			}
			if err := k.Produce(ctx, stream[i:min(i+500, len(stream))]...); err != nil {
				produced <- err
				return
			}
		}
		produced <- nil
	}()
	for i := range kills {
		c := startChild(t, k, "txn-dedupe", group, in, time.Millisecond, func([]byte) {})
		target := committedSumQuiet(k, group, in) + int64(300+rng.IntN(700))
		testenv.WaitFor(t, time.Minute, "the child to commit", func() bool { return committedSumQuiet(k, group, in) >= min(target, total) })
		time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond) // a random moment, not a synchronisation
		c.kill()
		t.Logf("kill %d: %d inputs committed", i+1, committedSumQuiet(k, group, in))
	}
	c := startChild(t, k, "txn-dedupe", group, in, 0, func([]byte) {})
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "every input committed", func() bool { return k.CommittedAll(t, group, in) })
	if err := c.terminate(t); err != nil {
		t.Fatal(err)
	}

	want := make(map[string]bool, 2*messages)
	for j := range messages {
		want[fmt.Sprintf("m%05d#a", j)] = true
		want[fmt.Sprintf("m%05d#b", j)] = true
	}
	got := map[string]int{}
	for _, r := range k.ReadAll(t, in+".out") {
		got[string(r.Value)]++
	}
	lost, dups := tallyOutputs(got, want)
	kgot := kcatReadCommitted(t, k, in+".out")
	klost, kdups := tallyOutputs(kgot, want)
	addRelRow(relRow{Scope: "Kafka", Fault: fmt.Sprintf("upstream duplicates: %d of %d messages sent again while the member is SIGKILLed (txn.Options.Dedupe; read_committed, kcat)",
		len(stream)-messages, messages), Records: len(stream), Faults: int64(len(stream) - messages), Kills: int64(kills),
		Lost: max(lost, klost) / 2, Dups: max(dups, kdups) / 2, Duration: time.Since(start), Passed: lost+dups+klost+kdups == 0})
	checkOutputs(t, "Go read_committed reader", got, want)
	checkOutputs(t, "kcat read_committed", kgot, want)
}

// tallyOutputs counts the outputs of want that got lacks, and the extra
// copies got holds.
func tallyOutputs(got map[string]int, want map[string]bool) (lost, dups int) {
	for v := range want {
		if got[v] == 0 {
			lost++
		}
	}
	for _, n := range got {
		dups += max(n-1, 0)
	}
	return lost, dups
}

// kcatReadCommitted reads topic with kcat (librdkafka), read_committed,
// and counts each value.
func kcatReadCommitted(t *testing.T, k *testenv.Kafka, topic string) map[string]int {
	t.Helper()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat is not installed (Debian: apt-get install kcat); .ci/run installs it")
	}
	kctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw, err := exec.CommandContext(kctx, kcat, "-b", strings.Join(k.Brokers, ","), "-C", "-t", topic,
		"-o", "beginning", "-e", "-q", "-f", "%s\n", "-X", "isolation.level=read_committed").Output()
	if err != nil {
		t.Fatalf("kcat: %v", err)
	}
	got := map[string]int{}
	for _, v := range strings.Fields(string(raw)) {
		got[v]++
	}
	return got
}
