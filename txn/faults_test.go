package txn_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// A member restarted after it died between committing its offsets and
// ending its transaction fences its predecessor and aborts that
// transaction at once, instead of waiting for the broker to time it out:
// it handles records promptly, the predecessor's output is never visible,
// and every input's outputs are there once.
func TestRestartFencesThePredecessorsOpenTransaction(t *testing.T) {
	k := setup(t)
	good := produceInputs(t, k, 30, 0)
	k.OpenTransaction(t, "restart-1", "g-restart", "in", 3, 0, &kgo.Record{Topic: "out", Value: []byte("predecessor#a")})

	r, err := txn.New(config(k, "g-restart"), txn.Options{TransactionalID: "restart-1", TransactionTimeout: 5 * time.Minute}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop := runFor(t, r)
	// Far below the five-minute transaction timeout the predecessor's
	// transaction would otherwise hold the group's offsets for.
	testenv.WaitFor(t, 20*time.Second, "every input handled", func() bool { return r.Stats().Kafka.Records == 30 })
	t.Logf("handled every input %s after the start", time.Since(start).Round(time.Millisecond))
	testenv.WaitFor(t, 20*time.Second, "offsets committed", func() bool { return k.CommittedAll(t, "g-restart", "in") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, good)
}

// logCapture is a slog handler that keeps every line it is given.
type logCapture struct {
	mu    *sync.Mutex
	lines *[]string
	attrs []slog.Attr
}

func newLogCapture() *logCapture { return &logCapture{mu: &sync.Mutex{}, lines: new([]string)} }

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }

func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	for _, a := range c.attrs {
		fmt.Fprintf(&b, " %s", a)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s", a)
		return true
	})
	c.mu.Lock()
	*c.lines = append(*c.lines, b.String())
	c.mu.Unlock()
	return nil
}

func (c *logCapture) WithAttrs(as []slog.Attr) slog.Handler {
	return &logCapture{mu: c.mu, lines: c.lines, attrs: append(slices.Clone(c.attrs), as...)}
}

func (c *logCapture) WithGroup(string) slog.Handler { return c }

// matching returns the captured lines that contain every one of words.
func (c *logCapture) matching(words ...string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range *c.lines {
		ok := true
		for _, w := range words {
			ok = ok && strings.Contains(l, w)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// An input topic that does not exist is named in one warning, instead of
// the runner waiting for it silently; once it is created, its records are
// handled.
func TestMissingInputTopicIsLoggedOnce(t *testing.T) {
	k := setup(t)
	logs := newLogCapture()
	cfg := config(k, "g-missing-in")
	cfg.Topics = []string{"orders-missing"}
	cfg.Logger = slog.New(logs)
	r, err := txn.New(cfg, txn.Options{TransactionalID: "missing-in-1"}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, 20*time.Second, "a warning naming the missing input topic", func() bool {
		return len(logs.matching("WARN", "orders-missing", "does not exist")) > 0
	})
	if err := k.CreateTopic(context.Background(), "orders-missing", 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(context.Background(), &kgo.Record{Topic: "orders-missing", Value: []byte("late-order")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the record of the created topic handled", func() bool { return r.Stats().Kafka.Records == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := logs.matching("orders-missing", "does not exist"); len(got) != 1 {
		t.Fatalf("the missing input topic was reported %d times, want once: %q", len(got), got)
	}
}

// An output to a topic that does not exist aborts the transaction with an
// error, and a log line, that names the missing output topic and says to
// create it.
func TestMissingOutputTopicIsNamed(t *testing.T) {
	k := setup(t)
	logs := newLogCapture()
	cfg := config(k, "g-missing-out")
	cfg.Logger = slog.New(logs)
	h := txn.HandlerFunc(func(_ context.Context, r *consumer.Record, out txn.Emitter) error {
		out.Emit(&kgo.Record{Topic: "shipments-missing", Key: r.Key, Value: r.Value})
		return nil
	})
	if err := k.Produce(context.Background(), &kgo.Record{Topic: "in", Key: []byte("k"), Value: []byte("order-1")}); err != nil {
		t.Fatal(err)
	}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "missing-out-1"}, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, 40*time.Second, "an error naming the missing output topic", func() bool {
		return len(logs.matching("output topic", "shipments-missing", "does not exist", "create it")) > 0
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if r.Stats().Kafka.Records != 0 {
		t.Fatalf("%d records committed with their output missing", r.Stats().Kafka.Records)
	}
}

// An output the broker refuses to write (the client lacks the ACL) stops
// the runner with an error that names the topic, rather than aborting and
// consuming the same records again forever; nothing of the transaction
// commits, so the records wait for a runner that may write.
func TestRefusedOutputStopsTheRunner(t *testing.T) {
	k := setup(t)
	if _, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "out", Err: kerr.TopicAuthorizationFailed, Count: -1}); err != nil {
		t.Skip(err) // refusing a write needs the in-process kfake cluster
	}
	if err := k.Produce(context.Background(), &kgo.Record{Topic: "in", Key: []byte("k"), Value: []byte("order-1")}); err != nil {
		t.Fatal(err)
	}
	r, err := txn.New(config(k, "g-refused-out"), txn.Options{TransactionalID: "refused-out-1"}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatal("the runner was still running 30 s after the broker refused its output")
	}
	if !errors.Is(err, kerr.TopicAuthorizationFailed) || !strings.Contains(err.Error(), "out") || !strings.Contains(err.Error(), "grant") {
		t.Fatalf("Run returned %v, want the refusal of topic out and what to do", err)
	}
	if got := r.Stats().Kafka.Records; got != 0 {
		t.Fatalf("%d records committed with their output refused", got)
	}
	if got, err := k.CommittedOffsets(context.Background(), "g-refused-out", "in"); err != nil || len(got) != 0 {
		t.Fatalf("committed offsets %v (%v), want none", got, err)
	}
}

// The version changelog is restored only once the group's offsets are
// stable: when the previous owner's last transaction is still open as the
// partition is assigned (its markers not written yet), the new owner does
// not restore the versions from before that transaction and then resume
// after it, which would take the key's next version for a gap.
func TestVersionsRestoredOnceTheChangelogIsStable(t *testing.T) {
	k := setup(t)
	const group = "g-stable"
	cfg := config(k, group)
	start := func(id string) (*txn.Runner, func() error) {
		t.Helper()
		r, err := txn.New(cfg, txn.Options{TransactionalID: id, Versions: &sequence.Config{GapTimeout: time.Hour}}, versioned(t))
		if err != nil {
			t.Fatal(err)
		}
		return r, runFor(t, r)
	}
	produceVersion(t, k, "acct", "1")
	produceVersion(t, k, "acct", "2")
	r1, stop := start("stable-1")
	testenv.WaitFor(t, 20*time.Second, "run 1 applied two versions", func() bool { return r1.Stats().Kafka.Outputs == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// The previous owner applied version 3 in a transaction that has
	// committed the offsets past it but not ended yet.
	v3 := &kgo.Record{Topic: "in", Key: []byte("acct"), Value: []byte("acct@3"), Headers: []kgo.RecordHeader{{Key: "version", Value: []byte("3")}}}
	if err := k.Produce(context.Background(), v3); err != nil {
		t.Fatal(err)
	}
	produceVersion(t, k, "acct", "4")
	changelog := txn.VersionsTopic(group, "in")
	ctx := context.Background()
	prev, err := k.Client(kgo.TransactionalID("stable-previous-owner"), kgo.TransactionTimeout(5*time.Minute), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prev.Close()
	if err := prev.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := prev.ProduceSync(ctx,
		&kgo.Record{Topic: "out", Partition: 0, Key: []byte("acct"), Value: []byte("acct:3")},
		&kgo.Record{Topic: changelog, Partition: v3.Partition, Key: []byte("vacct"), Value: []byte("3")},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	td, err := k.Admin().ListTopics(ctx, "in")
	if err != nil {
		t.Fatal(err)
	}
	id, epoch, err := prev.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oc := kmsg.NewPtrTxnOffsetCommitRequest()
	oc.TransactionalID, oc.Group, oc.ProducerID, oc.ProducerEpoch, oc.Generation = "stable-previous-owner", group, id, epoch, -1
	ot := kmsg.NewTxnOffsetCommitRequestTopic()
	ot.Topic, ot.TopicID = "in", td["in"].ID
	op := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	op.Partition, op.Offset, op.LeaderEpoch = v3.Partition, v3.Offset+1, -1
	ot.Partitions = append(ot.Partitions, op)
	oc.Topics = append(oc.Topics, ot)
	if resp, err := oc.RequestWith(ctx, prev); err != nil || kerr.ErrorForCode(resp.Topics[0].Partitions[0].ErrorCode) != nil {
		t.Fatalf("TxnOffsetCommit: %v %v", err, resp)
	}

	// The next owner is assigned the partition while that transaction is
	// open; the transaction commits once the owner has either read the
	// changelog or waited on the unstable offsets for a while.
	restored, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ListOffsets}, Topic: changelog, Observe: true, Count: -1})
	if err != nil {
		t.Skip(err) // the moment needs kfake's request observation
	}
	fetched, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetFetch}, Group: group, Observe: true, Count: -1})
	if err != nil {
		t.Fatal(err)
	}
	r2, stop := start("stable-2")
	testenv.WaitFor(t, 30*time.Second, "the next owner to read the changelog or wait on the unstable offsets", func() bool {
		return restored.Hits() > 0 || fetched.Hits() >= 3
	})
	if err := prev.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "run 2 handled version 4", func() bool { return r2.Stats().Kafka.Records == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if s := r2.Stats(); s.Kafka.GapsDetected != 0 || s.Kafka.Outputs != 1 {
		t.Fatalf("run 2: %+v; want version 4 applied after 3, no gap", s)
	}
	var got []string
	for _, r := range k.ReadAll(t, "out") {
		got = append(got, string(r.Value))
	}
	if fmt.Sprint(got) != "[acct:1 acct:2 acct:3 acct:4]" {
		t.Fatalf("outputs %v, want acct:1 to acct:4 once each, in order", got)
	}
}

// A runner that stops on an error outside the transaction's end (here the
// broker refuses to let it read its input) aborts its open transaction
// before it returns: left open, the transaction would hold every
// read_committed consumer of its outputs back until the broker timed it
// out (TransactionTimeout, 2 minutes by default).
func TestFatalStopAbortsTheOpenTransaction(t *testing.T) {
	k := setup(t)
	if k.Cluster == nil {
		t.Skip("refusing a fetch needs the in-process kfake cluster")
	}
	ctx := context.Background()
	if err := k.Produce(ctx, &kgo.Record{Topic: "in", Key: []byte("k"), Value: []byte("order-1")}); err != nil {
		t.Fatal(err)
	}
	r, err := txn.New(config(k, "g-fatal-open"), txn.Options{TransactionalID: "fatal-open-1", CommitInterval: time.Minute}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	adm := k.Admin()
	written := func() int64 {
		ends, err := adm.ListEndOffsets(ctx, "out")
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n
	}
	testenv.WaitFor(t, 30*time.Second, "the output written in the open transaction", func() bool { return written() > 0 })
	if _, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: "in", Err: kerr.TopicAuthorizationFailed, Count: -1}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, kerr.TopicAuthorizationFailed) {
			t.Fatalf("Run returned %v, want the refused read", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the runner kept running after the broker refused its input")
	}
	stable, err := adm.ListCommittedOffsets(ctx, "out")
	if err != nil {
		t.Fatal(err)
	}
	ends, err := adm.ListEndOffsets(ctx, "out")
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(e kadm.ListedOffset) {
		if s, ok := stable.Lookup("out", e.Partition); !ok || s.Offset < e.Offset {
			t.Errorf("out[%d]: last stable offset %d below its end %d after Run returned: the transaction is still open, and read_committed consumers of out wait for the broker to time it out", e.Partition, s.Offset, e.Offset)
		}
	})
	if got := r.Stats().Kafka.Records; got != 0 {
		t.Fatalf("%d records committed; want none (the transaction aborted)", got)
	}
}
