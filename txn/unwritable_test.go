package txn_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// createLimited creates topic with one partition per entry of nothing but
// its max.message.bytes set to limit.
func createLimited(t *testing.T, k *testenv.Kafka, topic string, partitions int32, limit int) {
	t.Helper()
	v := fmt.Sprint(limit)
	resp, err := k.Admin().CreateTopic(context.Background(), partitions, -1, map[string]*string{"max.message.bytes": &v}, topic)
	if err == nil {
		err = resp.Err
	}
	if err == nil {
		err = k.WaitTopic(context.Background(), topic, partitions)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// incompressible returns n bytes the producer's compression cannot
// shrink: the broker's limit applies to a batch as compressed.
func incompressible(n int) string {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(n), byte(n >> 8)}).Read(b)
	return string(b)
}

// keyFor returns a key that kgo's default partitioner puts in partition p
// of a topic with n partitions.
func keyFor(t *testing.T, p, n int32, prefix string) []byte {
	t.Helper()
	part := kgo.StickyKeyPartitioner(nil).ForTopic("any")
	for i := range 1000 {
		key := []byte(fmt.Sprintf("%s-%d", prefix, i))
		if int32(part.Partition(&kgo.Record{Key: key}, int(n))) == p {
			return key
		}
	}
	t.Fatalf("no key for partition %d", p)
	return nil
}

// checkOutputs checks that topic holds, read_committed, exactly one
// output per input of want.
func checkOutputsOnce(t *testing.T, k *testenv.Kafka, topic string, want []string) {
	t.Helper()
	got := map[string]int{}
	for _, r := range k.ReadAll(t, topic) {
		got[string(r.Value)]++
	}
	for _, v := range want {
		if got[v] != 1 {
			t.Fatalf("output %q seen %d times, want once (all: %v)", v, got[v], got)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d distinct outputs, want %d", len(got), len(want))
	}
}

// An output larger than the producer can ever write dead-letters its
// input, as Terminal, with the reason; the other inputs' outputs commit
// exactly once, and no transaction aborts for it. Before, every
// transaction aborted on it and rewound, so nothing committed anywhere
// and Run went on as if healthy.
func TestOversizedOutputDeadLettersItsInput(t *testing.T) {
	k := setup(t)
	good := produceInputs(t, k, 30, 0)
	huge := make([]byte, 2<<20)
	h := txn.HandlerFunc(func(_ context.Context, r *consumer.Record, out txn.Emitter) error {
		v := r.Value
		if string(v) == "order-00007" {
			v = huge
		}
		out.Emit(&kgo.Record{Topic: "out", Key: r.Key, Value: v})
		return nil
	})
	r, err := txn.New(config(k, "g-huge"), txn.Options{TransactionalID: "huge-1"}, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, 30*time.Second, "every input committed", func() bool { return r.Stats().Kafka.Records == 30 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := r.Stats().Kafka
	if st.DeadLettered != 1 || st.Outputs != 29 || st.Aborted != 0 {
		t.Fatalf("stats %+v: want 1 dead-lettered, 29 outputs, no transaction aborted", st)
	}
	checkOneInputDeadLettered(t, k, "g-huge", "out", good, "order-00007", "bytes", "ProducerBatchMaxBytes")
}

// checkOneInputDeadLettered checks that topic holds, read_committed, one
// output of every input of good but bad, and group's dead-letter topic
// bad alone, as Terminal, its error containing every one of words.
func checkOneInputDeadLettered(t *testing.T, k *testenv.Kafka, group, topic string, good []string, bad string, words ...string) {
	t.Helper()
	var want []string
	for _, g := range good {
		if g != bad {
			want = append(want, g)
		}
	}
	checkOutputsOnce(t, k, topic, want)
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || string(dlt[0].Value) != bad {
		t.Fatalf("%d DLT records, want %s's", len(dlt), bad)
	}
	c, e := testenv.Header(dlt[0], retrytopic.HeaderErrorClass), testenv.Header(dlt[0], retrytopic.HeaderError)
	if c != "terminal" {
		t.Fatalf("DLT record's class %q, want terminal", c)
	}
	for _, w := range words {
		if !strings.Contains(e, w) {
			t.Fatalf("DLT record's error %q does not say %q", e, w)
		}
	}
}

// An output the broker refuses (larger than its topic's max.message.bytes,
// though the producer writes it) aborts its transaction once; its input
// is then dead-lettered, as Terminal, with the broker's error, and every
// other input's output commits exactly once.
func TestOutputRefusedByTheBrokerDeadLettersItsInput(t *testing.T) {
	k := setup(t)
	createLimited(t, k, "out-limited", 2, 4096)
	good := produceInputs(t, k, 30, 0)
	small, large := keyFor(t, 0, 2, "small"), keyFor(t, 1, 2, "large")
	big := incompressible(8192)
	h := txn.HandlerFunc(func(_ context.Context, r *consumer.Record, out txn.Emitter) error {
		if string(r.Value) == "order-00011" {
			out.Emit(&kgo.Record{Topic: "out-limited", Key: large, Value: []byte(big)})
			return nil
		}
		out.Emit(&kgo.Record{Topic: "out-limited", Key: small, Value: r.Value})
		return nil
	})
	r, err := txn.New(config(k, "g-limited"), txn.Options{TransactionalID: "limited-1"}, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, 30*time.Second, "every input committed", func() bool { return r.Stats().Kafka.Records == 30 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := r.Stats().Kafka
	if st.DeadLettered != 1 || st.Aborted == 0 {
		t.Fatalf("stats %+v: want 1 dead-lettered after an aborted transaction", st)
	}
	checkOneInputDeadLettered(t, k, "g-limited", "out-limited", good, "order-00011", "MESSAGE_TOO_LARGE")
}

// Record batches the broker refuses though each record alone fits (the
// topic's max.message.bytes below the producer's batch limit) do not say
// which input is bad: no input is dead-lettered for it, and after a few
// transactions in a row abort that way, Run stops with ErrUnwritable and
// what to change, with nothing committed.
func TestBatchesRefusedTogetherStopTheRunner(t *testing.T) {
	k := setup(t)
	createLimited(t, k, "out-tight", 1, 3000)
	produceInputs(t, k, 60, 0)
	pad := incompressible(1200)
	h := txn.HandlerFunc(func(_ context.Context, r *consumer.Record, out txn.Emitter) error {
		out.Emit(&kgo.Record{Topic: "out-tight", Key: []byte("k"), Value: []byte(string(r.Value) + pad)})
		return nil
	})
	cfg := config(k, "g-tight")
	r, err := txn.New(cfg, txn.Options{TransactionalID: "tight-1", CommitInterval: 200 * time.Millisecond}, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("the runner was still running after 60 s of refused batches (stats %+v)", r.Stats().Kafka)
	}
	if !errors.Is(err, txn.ErrUnwritable) || !strings.Contains(err.Error(), "ProducerBatchMaxBytes") {
		t.Fatalf("Run returned %v, want ErrUnwritable saying what to change", err)
	}
	if st := r.Stats().Kafka; st.DeadLettered != 0 || st.Records != 0 {
		t.Fatalf("stats %+v: want nothing dead-lettered or committed", st)
	}
}

// A dead-letter record the broker refuses stops the runner with
// ErrUnwritable and what to change, instead of aborting forever; the
// input is neither committed nor lost.
func TestRefusedDeadLetterStopsTheRunner(t *testing.T) {
	k := setup(t)
	createLimited(t, k, retrytopic.DLTopic("g-dlt-limited"), 1, 2048)
	if err := k.Produce(context.Background(), &kgo.Record{Topic: "in", Key: []byte("k"), Value: []byte("poison-" + incompressible(4096))}); err != nil {
		t.Fatal(err)
	}
	r, err := txn.New(config(k, "g-dlt-limited"), txn.Options{TransactionalID: "dlt-limited-1"}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatal("the runner was still running 30 s after the dead-letter topic refused a record")
	}
	if !errors.Is(err, txn.ErrUnwritable) || !strings.Contains(err.Error(), retrytopic.DLTopic("g-dlt-limited")) || !strings.Contains(err.Error(), "max.message.bytes") {
		t.Fatalf("Run returned %v, want ErrUnwritable naming the dead-letter topic and what to change", err)
	}
	if got, err := k.CommittedOffsets(context.Background(), "g-dlt-limited", "in"); err != nil || len(got) != 0 {
		t.Fatalf("committed offsets %v (%v), want none", got, err)
	}
}

// A record that would wait for its version gap to heal, but whose
// changelog record (the record itself) is larger than the producer
// writes, is dead-lettered at once, as Terminal; the key goes on with its
// next version. Before, every transaction aborted on the changelog record.
func TestUnparkableRecordIsDeadLettered(t *testing.T) {
	k := setup(t)
	if err := k.CreateTopic(context.Background(), "in-park", 1); err != nil {
		t.Fatal(err)
	}
	big := incompressible(900 << 10)
	for _, v := range []string{"1", "3", "2"} {
		val := []byte(v)
		if v == "3" {
			val = []byte(big)
		}
		rec := &kgo.Record{Topic: "in-park", Key: []byte("k"), Value: val, Headers: []kgo.RecordHeader{{Key: "version", Value: []byte(v)}}}
		if err := k.Produce(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
	cfg := config(k, "g-park-big")
	cfg.Topics = []string{"in-park"}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "park-big-1", Versions: &sequence.Config{Gaps: sequence.Wait, GapTimeout: time.Hour}}, versioned(t))
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, 30*time.Second, "three records committed", func() bool { return r.Stats().Kafka.Records == 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats().Kafka; st.Outputs != 2 || st.DeadLettered != 1 || st.Aborted != 0 {
		t.Fatalf("stats %+v: want versions 1 and 2 applied, 3 dead-lettered, no transaction aborted", st)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic("g-park-big"))
	if len(dlt) != 1 || testenv.Header(dlt[0], "version") != "3" || !strings.Contains(testenv.Header(dlt[0], retrytopic.HeaderError), "changelog") {
		t.Fatalf("%d DLT records, want version 3's, saying its changelog record is too large", len(dlt))
	}
}
