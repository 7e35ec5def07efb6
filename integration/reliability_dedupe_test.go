package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"sync"
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
	stream := upstreamStream(in, messages, rng)
	total := int64(len(stream))
	produced := produceAhead(ctx, k, group, in, stream)
	c := killChildrenWhileCommitting(t, k, group, in, kills, total, rng, func(_ int, delay time.Duration) *child {
		return startChild(t, k, "txn-dedupe", group, in, delay, func([]byte) {})
	})
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

// Upstream duplicates in the AtLeastOnce scope with the Redis store: the
// same stream and kills as the Kafka row, the handler's calls counted per
// message id. A message is handled more than once only in the crash window
// the guard leaves (its handler returned, the member was killed before
// the store acknowledged its identity): the test tells each extra call by
// the store's acknowledgements the killed member printed, and counts those
// outside the window as duplicates.
func TestReliabilityUpstreamDuplicatesAtLeastOnce(t *testing.T) {
	start := time.Now()
	k := testenv.KafkaT(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	rd := testenv.RedisT(t)
	ctx := context.Background()
	const in, group = "rel-dups-alo", "g-rel-dups-alo"
	messages, kills := upstreamSize()
	if err := k.CreateTopic(ctx, in, 4); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	stream := upstreamStream(in, messages, rng)
	total := int64(len(stream))
	produced := produceAhead(ctx, k, group, in, stream)
	var mu sync.Mutex
	calls := map[string][]int{} // message id → the children that called its handler, in turn
	var children []*child
	run := func(i int, delay time.Duration) *child {
		c := startChild(t, k, "alo-dedupe", group, in, delay, func(v []byte) {
			mu.Lock()
			calls[string(v)] = append(calls[string(v)], i)
			mu.Unlock()
		}, childRedisEnv+"="+rd.URL)
		children = append(children, c)
		return c
	}
	c := killChildrenWhileCommitting(t, k, group, in, kills, total, rng, run)
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "every input committed", func() bool { return k.CommittedAll(t, group, in) })
	if err := c.terminate(t); err != nil {
		t.Fatal(err)
	}
	remembered := make([]map[string]bool, len(children))
	for i, ch := range children {
		remembered[i] = map[string]bool{}
		for _, ev := range ch.remembered.list("") {
			for _, id := range strings.Split(ev.line, ",") {
				remembered[i][id] = true
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	lost, inWindow, outside := 0, 0, 0
	for j := range messages {
		id := fmt.Sprintf("m%05d", j)
		cs := calls[id]
		if len(cs) == 0 {
			lost++
		}
		for n := 1; n < len(cs); n++ {
			prev := cs[n-1]
			if prev < kills && prev != cs[n] && !remembered[prev][id] {
				inWindow++ // the member that handled it was killed before the store acknowledged it
			} else {
				outside++
				t.Errorf("message %s handled again by child %d after child %d had its identity acknowledged (calls by children %v)", id, cs[n], prev, cs)
			}
		}
	}
	t.Logf("%d messages, %d sent again, %d kills: %d handler calls beyond one, all in the crash window: %d", messages, len(stream)-messages, kills, inWindow+outside, inWindow)
	addRelRow(relRow{Scope: "AtLeastOnce", Fault: fmt.Sprintf("upstream duplicates: %d of %d messages sent again while the member is SIGKILLed (Redis dedupe store; %d calls again in the crash window between a handler's success and the store's acknowledgement)",
		len(stream)-messages, messages, inWindow), Records: len(stream), Faults: int64(len(stream) - messages), Kills: int64(kills),
		Lost: lost, Dups: outside, Duration: time.Since(start), Passed: lost == 0 && outside == 0})
	if lost > 0 {
		t.Errorf("%d messages never handled", lost)
	}
}

// upstreamStream is every message of in, and every fifth one again 50 to
// 2,000 messages later (the same message id and key).
func upstreamStream(in string, messages int, rng *rand.Rand) []*kgo.Record {
	msg := func(j int) *kgo.Record {
		id := fmt.Sprintf("m%05d", j)
		return &kgo.Record{Topic: in, Key: fmt.Appendf(nil, "c%03d", j%97), Value: []byte(id),
			Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}}
	}
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
	for at := messages; len(resend) > 0; at++ {
		for _, d := range resend[at] {
			stream = append(stream, msg(d))
		}
		delete(resend, at)
	}
	return stream
}

// produceAhead produces stream in steps of 500 records, staying at most
// 3,000 ahead of the group's committed offsets of in; the channel says how
// it ended.
func produceAhead(ctx context.Context, k *testenv.Kafka, group, in string, stream []*kgo.Record) <-chan error {
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
	return produced
}

// killChildrenWhileCommitting starts kills children (start(i, delay)), each SIGKILLed at a
// random moment once the group committed a few hundred more of total
// records of in, and returns one more, started after them and left running.
func killChildrenWhileCommitting(t *testing.T, k *testenv.Kafka, group, in string, kills int, total int64, rng *rand.Rand, start func(i int, delay time.Duration) *child) *child {
	t.Helper()
	for i := range kills {
		c := start(i, time.Millisecond)
		target := committedSumQuiet(k, group, in) + int64(300+rng.IntN(700))
		testenv.WaitFor(t, time.Minute, "the child to commit", func() bool { return committedSumQuiet(k, group, in) >= min(target, total) })
		time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond) // a random moment, not a synchronisation
		c.kill()
		t.Logf("kill %d: %d inputs committed", i+1, committedSumQuiet(k, group, in))
	}
	return start(kills, 0)
}
