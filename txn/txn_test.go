package txn_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/internal/testmain"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/txn"
)

func TestMain(m *testing.M) {
	testmain.Main(m)
}

func logger() *slog.Logger {
	if os.Getenv("KSCOPE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// enrich emits two outputs per input ("<value>#a", "<value>#b") and
// dead-letters inputs whose value starts with "poison".
var enrich = txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
	if strings.HasPrefix(string(r.Value), "poison") {
		return consumer.DecodeError(errors.New("unparseable order"))
	}
	for _, s := range []string{"a", "b"} {
		out.Emit(&kgo.Record{Topic: "out", Key: r.Key, Value: []byte(string(r.Value) + "#" + s)})
	}
	return nil
})

func config(k *testenv.Kafka, group string) consumer.Config {
	return consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{"in"}, Shards: 4, Logger: logger(),
		Failures:      retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond},
		ClientOptions: clientOpts(),
		GroupProtocol: consumer.GroupProtocol(testenv.GroupProtocol()),
	}
}

func clientOpts() []kgo.Opt {
	if os.Getenv("KSCOPE_TEST_KGO_LOG") != "" {
		return []kgo.Opt{kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelInfo, nil))}
	}
	return nil
}

// checkExactlyOnce reads the outputs read_committed and checks that every
// input's two outputs are there exactly once, and nothing else.
func checkExactlyOnce(t *testing.T, k *testenv.Kafka, inputs []string) {
	t.Helper()
	got := map[string]int{}
	for _, r := range k.ReadAll(t, "out") {
		got[string(r.Value)]++
	}
	want := map[string]bool{}
	for _, in := range inputs {
		for _, s := range []string{"a", "b"} {
			want[in+"#"+s] = true
		}
	}
	for v, n := range got {
		if !want[v] {
			t.Fatalf("unexpected output %q", v)
		}
		if n != 1 {
			t.Fatalf("output %q seen %d times", v, n)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d distinct outputs, want %d", len(got), len(want))
	}
}

func produceInputs(t *testing.T, k *testenv.Kafka, n int, poisonEvery int) (good []string) {
	t.Helper()
	var recs []*kgo.Record
	for i := range n {
		v := fmt.Sprintf("order-%05d", i)
		if poisonEvery > 0 && i%poisonEvery == poisonEvery-1 {
			v = "poison-" + v
		} else {
			good = append(good, v)
		}
		recs = append(recs, &kgo.Record{Topic: "in", Key: []byte(fmt.Sprintf("c%02d", i%17)), Value: []byte(v)})
	}
	if err := k.Produce(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	return good
}

func setup(t *testing.T, opts ...kfake.Opt) *testenv.Kafka {
	k := testenv.KafkaT(t, opts...)
	for _, topic := range []string{"in", "out"} {
		if err := k.CreateTopic(context.Background(), topic, 3); err != nil {
			t.Fatal(err)
		}
	}
	return k
}

func runFor(t *testing.T, r *txn.Runner) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var err error
	done := false
	stop = func() error {
		if !done {
			done = true
			cancel()
			err = <-errc
		}
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// Outputs and input offsets commit together; a poison input yields a DLT
// record and no output, in the same transaction.
func TestTransformExactlyOnceWithDLT(t *testing.T) {
	k := setup(t)
	good := produceInputs(t, k, 500, 50)
	r, err := txn.New(config(k, "g-enrich"), txn.Options{TransactionalID: "enrich-1"}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, time.Minute, "every input committed", func() bool { return r.Stats().Kafka.Records == 500 })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, "g-enrich", "in") })
	// The runner's Stats and Client are those of every runner.
	if st := r.Stats(); st.Done != 500 || st.Commits != st.Kafka.Committed || st.Commits == 0 || st.Assigned == 0 {
		t.Errorf("stats %+v: want Done 500, Commits the committed transactions, partitions assigned", st)
	}
	if r.Client() == nil {
		t.Error("Client() is nil while Run runs")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if r.Client() != nil {
		t.Error("Client() is not nil after Run returned")
	}
	checkExactlyOnce(t, k, good)
	dlt := k.ReadAll(t, retrytopic.DLTopic("g-enrich"))
	if len(dlt) != 10 || r.Stats().Kafka.DeadLettered != 10 {
		t.Fatalf("%d DLT records (stats %+v), want 10", len(dlt), r.Stats())
	}
	for _, d := range dlt {
		if !strings.HasPrefix(string(d.Value), "poison") || testenv.Header(d, retrytopic.HeaderErrorClass) != "terminal" {
			t.Fatalf("DLT record %q", d.Value)
		}
	}
	checkKcatReadCommitted(t, k, good)
}

// checkKcatReadCommitted reads the outputs with kcat (librdkafka) in
// read_committed mode and checks it sees the same outputs.
func checkKcatReadCommitted(t *testing.T, k *testenv.Kafka, inputs []string) {
	t.Helper()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat is not installed (Debian: apt-get install kcat); .ci/run installs it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kcat, "-b", strings.Join(k.Brokers, ","), "-C", "-t", "out",
		"-o", "beginning", "-e", "-q", "-f", "%s\n", "-X", "isolation.level=read_committed").Output()
	if err != nil {
		t.Fatalf("kcat: %v", err)
	}
	seen := map[string]int{}
	for _, v := range strings.Fields(string(out)) {
		seen[v]++
	}
	if len(seen) != 2*len(inputs) {
		t.Fatalf("kcat saw %d distinct outputs, want %d", len(seen), 2*len(inputs))
	}
	for v, n := range seen {
		if n != 1 {
			t.Fatalf("kcat saw %q %d times", v, n)
		}
	}
}

// Broker faults on EndTxn, AddOffsetsToTxn and Produce abort the
// transaction, which is retried: outputs still exactly once.
func TestBrokerFaultsAbortAndRetry(t *testing.T) {
	k := setup(t)
	good := produceInputs(t, k, 300, 0)
	faults := []kfake.Fault{
		{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.TransactionAbortable, Count: 1},
		{Keys: []kmsg.Key{kmsg.AddOffsetsToTxn}, Err: kerr.UnknownServerError, Count: 1},
		{Keys: []kmsg.Key{kmsg.Produce}, Topic: "out", Err: kerr.UnknownServerError, Count: 2},
	}
	h, err := k.Fault(faults...)
	if err != nil {
		t.Skip(err) // broker faults need the in-process kfake cluster
	}
	r, err := txn.New(config(k, "g-faults"), txn.Options{TransactionalID: "faults-1", CommitInterval: 20 * time.Millisecond}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	if err := h.Wait(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, "g-faults", "in") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, good)
}

// A second instance with the same transactional id fences the first: the
// first one's Run returns an error, the second carries on, and no output is
// duplicated.
func TestFencing(t *testing.T) {
	k := setup(t)
	good := produceInputs(t, k, 200, 0)
	block := make(chan struct{})
	var blocking atomic.Bool
	d := newDeliveries()
	firstCfg := config(k, "g-fence")
	firstCfg.Hooks = []hook.Hook{d}
	first, err := txn.New(firstCfg, txn.Options{TransactionalID: "fence-1"},
		txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
			if blocking.Load() {
				<-block // holds its transaction open
			}
			return enrich(ctx, r, out)
		}))
	if err != nil {
		t.Fatal(err)
	}
	firstErr := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { firstErr <- first.Run(ctx) }()
	// The first instance owns the transactional id and commits.
	testenv.WaitFor(t, time.Minute, "the first instance to commit", func() bool { return first.Stats().Kafka.Records == 200 })
	blocking.Store(true)
	var more []string
	for i := range 100 {
		more = append(more, fmt.Sprintf("late-%03d", i))
	}
	var recs []*kgo.Record
	for i, v := range more {
		recs = append(recs, &kgo.Record{Topic: "in", Key: []byte(fmt.Sprintf("c%02d", i%17)), Value: []byte(v)})
	}
	if err := k.Produce(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	second, err := txn.New(config(k, "g-fence"), txn.Options{TransactionalID: "fence-1"}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, second)
	// The second instance initializes the same transactional id, which
	// fences the first's producer epoch, and commits what it is given.
	testenv.WaitFor(t, time.Minute, "the second instance to commit", func() bool { return second.Stats().Kafka.Committed > 0 })
	close(block)
	select {
	case err := <-firstErr:
		if !errors.Is(err, txn.ErrFenced) {
			t.Fatalf("the fenced instance's Run returned %v, want txn.ErrFenced", err)
		}
		// The deliveries of its last transaction, which never committed,
		// ended (as aborted): their spans are exported.
		d.check(t, "")
	case <-time.After(time.Minute):
		t.Fatal("the fenced instance kept running")
	}
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, "g-fence", "in") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, append(good, more...))
}

// Members join and leave while inputs flow: every rebalance aborts the open
// transactions of the partitions that move, and the consumers rewind; no
// output is visible twice and none is lost.
func TestRebalanceAbortsAndRewinds(t *testing.T) {
	k := setup(t)
	good := produceInputs(t, k, 3000, 0)
	slow := txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
		time.Sleep(200 * time.Microsecond) // keeps transactions open across the rebalances
		return enrich(ctx, r, out)
	})
	newMember := func(id string) *txn.Runner {
		cfg := config(k, "g-txn-rebalance")
		cfg.ClientOptions = append(cfg.ClientOptions, kgo.HeartbeatInterval(50*time.Millisecond))
		r, err := txn.New(cfg, txn.Options{TransactionalID: id, CommitInterval: 20 * time.Millisecond, MaxRecords: 200}, slow)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := newMember("member-a")
	stopA := runFor(t, a)
	testenv.WaitFor(t, time.Minute, "a to commit", func() bool { return a.Stats().Kafka.Records > 300 })
	b := newMember("member-b")
	stopB := runFor(t, b)
	// Under the consumer protocol the broker moves one of the three
	// partitions to b, a heartbeat or two after it joins: a third of the
	// stream, of which a has often done two thirds by then.
	testenv.WaitFor(t, time.Minute, "b to commit", func() bool { return b.Stats().Kafka.Records > 100 })
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	c := newMember("member-c")
	stopC := runFor(t, c)
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, "g-txn-rebalance", "in") })
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	if err := stopC(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, good)
	if total := a.Stats().Kafka.Records + b.Stats().Kafka.Records + c.Stats().Kafka.Records; total != 3000 {
		t.Fatalf("members committed %d input records in all, want exactly 3000", total)
	}
}

// A TxnOffsetCommit that fails with an error the client does not treat as
// abortable (REQUEST_TIMED_OUT, a coordinator under load) ends the
// transaction as an abort: the runner counts it, rewinds and carries on,
// instead of returning from Run and stopping the pipeline. Outputs stay
// exactly once.
func TestOffsetCommitTimeoutAbortsAndRetries(t *testing.T) {
	k := setup(t)
	good := produceInputs(t, k, 200, 0)
	h, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.TxnOffsetCommit}, Err: kerr.RequestTimedOut, Count: 2})
	if err != nil {
		t.Skip(err) // broker faults need the in-process kfake cluster
	}
	r, err := txn.New(config(k, "g-txoc"), txn.Options{TransactionalID: "txoc-1", CommitInterval: 20 * time.Millisecond}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Wait(ctx, 2); err != nil {
		t.Fatalf("the fault was hit %d of 2 times: %v (Run: %v)", h.Hits(), err, stop())
	}
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, "g-txoc", "in") })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st := r.Stats(); st.Kafka.Aborted == 0 {
		t.Fatalf("no transaction was aborted: %+v", st)
	}
	checkExactlyOnce(t, k, good)
}

// An input written by a transactional producer (such as another Kafka-scope
// pipeline) ends in transaction markers: the transactions commit the
// input's offsets past them, so a caught-up group shows no lag. Records of
// the aborted input transactions produce nothing.
func TestTransactionalInputIsCommittedPastItsMarkers(t *testing.T) {
	k := setup(t)
	good := k.ProduceInTransactions(t, "upstream", "in", 3, 6, 10, func(x int) bool { return x%3 == 2 })
	r, err := txn.New(config(k, "g-markers"), txn.Options{TransactionalID: "markers-1"}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, time.Minute, "every committed input done", func() bool { return r.Stats().Kafka.Records == int64(len(good)) })
	testenv.WaitFor(t, 30*time.Second, "offsets committed past the last markers", func() bool { return k.CommittedAll(t, "g-markers", "in") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, good)
}

// An input transaction that aborts once the runner has caught up reaches
// it as a marker alone (the client drops the aborted records), with no
// input record to end a transaction of the runner's: the runner still
// ends one, with only its offsets, so that the group passes the marker
// and shows no lag without waiting for the next input record.
func TestAbortedInputAfterCatchUpIsCommittedPast(t *testing.T) {
	k := setup(t)
	good := k.ProduceInTransactions(t, "upstream", "in", 3, 2, 5, func(int) bool { return false })
	r, err := txn.New(config(k, "g-alone"), txn.Options{TransactionalID: "alone-1"}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, time.Minute, "every committed input done", func() bool { return r.Stats().Kafka.Records == int64(len(good)) })
	testenv.WaitFor(t, 30*time.Second, "offsets committed past the first markers", func() bool { return k.CommittedAll(t, "g-alone", "in") })
	k.ProduceInTransactions(t, "upstream", "in", 3, 1, 5, func(int) bool { return true })
	testenv.WaitFor(t, 30*time.Second, "offsets committed past the aborted transaction's markers", func() bool { return k.CommittedAll(t, "g-alone", "in") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, good)
}

// A member that sits idle through two rebalances (after its first
// transactions) loses partitions in both, and sees both revocations: the transactional session reports a revoke
// only once per transaction, so an idle member that did not end its
// (empty) transaction would keep a partition it no longer owns, and report
// it as assigned, with its lag, for as long as it runs.
func TestIdleMemberSeesEveryRevocation(t *testing.T) {
	k := setup(t)
	newMember := func(id string) *txn.Runner {
		cfg := config(k, "g-txn-idle")
		cfg.ClientOptions = append(cfg.ClientOptions, kgo.HeartbeatInterval(50*time.Millisecond))
		r, err := txn.New(cfg, txn.Options{TransactionalID: id, CommitInterval: 20 * time.Millisecond}, enrich)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := newMember("idle-a")
	runFor(t, a)
	testenv.WaitFor(t, time.Minute, "a assigned every partition", func() bool { return a.Stats().Assigned == 3 })
	// a works through some inputs, then sits idle through the two
	// rebalances.
	good := produceInputs(t, k, 30, 0)
	testenv.WaitFor(t, time.Minute, "a's inputs committed", func() bool { return a.Stats().Kafka.Records == int64(len(good)) })
	b := newMember("idle-b")
	runFor(t, b)
	testenv.WaitFor(t, time.Minute, "a partition moved to b", func() bool { return a.Stats().Assigned == 2 && b.Stats().Assigned == 1 })
	c := newMember("idle-c")
	runFor(t, c)
	testenv.WaitFor(t, time.Minute, "one partition each", func() bool {
		return a.Stats().Assigned == 1 && b.Stats().Assigned == 1 && c.Stats().Assigned == 1
	})
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, "g-txn-idle", "in") })
	checkExactlyOnce(t, k, good)
}

// A member whose producer ID takes long to initialise (the first
// initialisation on a new cluster creates the transaction log) joins the
// group only once it is: joined before, it lost partitions in rebalances
// before its first transaction began, and the transactional session
// reports only one revoke per transaction, so it kept a partition it no
// longer owned, and reported it as assigned, with its lag, for as long as
// it ran.
func TestSlowProducerInitJoinsTheGroupAfterIt(t *testing.T) {
	k := setup(t)
	slow, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.InitProducerID}, TxnID: "slow-a", Err: kerr.CoordinatorLoadInProgress, Count: -1})
	if err != nil {
		t.Skip(err) // holding a producer ID back needs the in-process kfake cluster
	}
	newMember := func(id string) *txn.Runner {
		cfg := config(k, "g-txn-slow")
		cfg.ClientOptions = append(cfg.ClientOptions, kgo.HeartbeatInterval(50*time.Millisecond))
		r, err := txn.New(cfg, txn.Options{TransactionalID: id, CommitInterval: 20 * time.Millisecond}, enrich)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := newMember("slow-a")
	runFor(t, a)
	if err := slow.Wait(context.Background(), 2); err != nil { // a is initialising its producer ID
		t.Fatal(err)
	}
	b := newMember("slow-b")
	runFor(t, b)
	testenv.WaitFor(t, time.Minute, "b assigned a partition", func() bool { return b.Stats().Assigned > 0 })
	c := newMember("slow-c")
	runFor(t, c)
	testenv.WaitFor(t, time.Minute, "b and c share every partition", func() bool {
		return b.Stats().Assigned+c.Stats().Assigned == 3 && c.Stats().Assigned > 0
	})
	slow.Remove()
	testenv.WaitFor(t, time.Minute, "one partition each", func() bool {
		return a.Stats().Assigned == 1 && b.Stats().Assigned == 1 && c.Stats().Assigned == 1
	})
	good := produceInputs(t, k, 30, 0)
	testenv.WaitFor(t, time.Minute, "every input committed", func() bool {
		return a.Stats().Kafka.Records+b.Stats().Kafka.Records+c.Stats().Kafka.Records == int64(len(good))
	})
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, "g-txn-slow", "in") })
	checkExactlyOnce(t, k, good)
}

// The broker commits a transaction but the runner does not hear it: its
// EndTxn answer comes after the client gave up, and the retries meet a
// coordinator that is loading. The runner reads back what the group
// committed and goes on from it, instead of taking the transaction for
// aborted and producing its outputs a second time.
func TestUnconfirmedCommitIsNotRedone(t *testing.T) {
	k := setup(t)
	if k.Cluster == nil {
		t.Skip("the slow coordinator needs the in-process kfake cluster")
	}
	good := produceInputs(t, k, 60, 0)
	var mu sync.Mutex
	var slowedAt time.Time
	k.Cluster.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		k.Cluster.KeepControl()
		r := req.(*kmsg.EndTxnRequest)
		mu.Lock()
		first := slowedAt.IsZero() && r.Commit
		if first {
			slowedAt = time.Now()
		}
		failing := !slowedAt.IsZero() && !first && time.Since(slowedAt) < 6*time.Second
		mu.Unlock()
		switch {
		case first:
			// The coordinator answers after the client's request
			// timeout; the commit itself happens.
			time.Sleep(1500 * time.Millisecond)
			return nil, nil, false
		case failing:
			resp := r.ResponseKind().(*kmsg.EndTxnResponse)
			resp.ErrorCode = kerr.CoordinatorLoadInProgress.Code
			return resp, nil, true
		}
		return nil, nil, false
	})
	cfg := config(k, "g-unconfirmed")
	cfg.ClientOptions = append(cfg.ClientOptions, kgo.RequestTimeoutOverhead(time.Second), kgo.RequestRetries(2))
	r, err := txn.New(cfg, txn.Options{TransactionalID: "unconfirmed-1", CommitInterval: 20 * time.Millisecond}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, time.Minute, "a commit attempted", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !slowedAt.IsZero()
	})
	testenv.WaitFor(t, time.Minute, "every input committed", func() bool { return r.Stats().Kafka.Records >= int64(len(good)) })
	testenv.WaitFor(t, time.Minute, "offsets committed", func() bool { return k.CommittedAll(t, "g-unconfirmed", "in") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, good)
}

// The member loses its partitions while its transaction holds outputs,
// and the coordinator does not answer the abort that follows (the end of
// that transaction fails and the producer is reloaded). The transaction
// held no input offset of a partition the member still owns, so there is
// nothing to read its outcome back from; the session never commits such a
// transaction. The runner takes it for aborted and goes on: it rejoins,
// consumes the records again, and commits each output once.
func TestLostPartitionsWhileTheAbortFailsKeepRunning(t *testing.T) {
	k := setup(t)
	if k.Cluster == nil {
		t.Skip("the lost partitions and the failing abort need the in-process kfake cluster")
	}
	const group = "g-lost-abort"
	good := produceInputs(t, k, 60, 0)

	var produced, failAborts atomic.Bool
	var abortsFailed, reloads atomic.Int32
	k.Cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		k.Cluster.KeepControl()
		produced.Store(true) // the inputs are in already: a produce now is the runner's
		return nil, nil, false
	})
	k.Cluster.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		k.Cluster.KeepControl()
		r := req.(*kmsg.EndTxnRequest)
		if r.Commit || !failAborts.Load() {
			return nil, nil, false
		}
		abortsFailed.Add(1)
		resp := r.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.CoordinatorLoadInProgress.Code
		return resp, nil, true
	})
	k.Cluster.ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
		k.Cluster.KeepControl()
		if abortsFailed.Load() > 0 && failAborts.CompareAndSwap(true, false) {
			reloads.Add(1) // the producer reloads after the failed end: the coordinator answers again
		}
		return nil, nil, false
	})

	// One record waits, on its first delivery, until the partitions are
	// lost: the transaction stays open (it would end after 30 s, or
	// at 60 records) with the outputs of the records before it.
	var blockOnce sync.Once
	blocked := make(chan struct{})
	h := txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
		if string(r.Value) == "order-00040" {
			first := false
			blockOnce.Do(func() { first = true })
			if first {
				close(blocked)
				<-ctx.Done()
				return ctx.Err()
			}
		}
		return enrich(ctx, r, out)
	})
	cfg := config(k, group)
	cfg.ClientOptions = append(cfg.ClientOptions, kgo.HeartbeatInterval(100*time.Millisecond), kgo.RequestRetries(2))
	r, err := txn.New(cfg, txn.Options{TransactionalID: "lost-abort-1", CommitInterval: 30 * time.Second, MaxRecords: len(good)}, h)
	if err != nil {
		t.Fatal(err)
	}
	errc, cancel := runWatched(r)
	defer cancel()
	<-blocked
	testenv.WaitFor(t, time.Minute, "outputs produced in the open transaction", produced.Load)
	failAborts.Store(true)
	if _, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{testenv.HeartbeatKey()}, Group: group, Err: kerr.UnknownMemberID}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, errc, "the partitions were lost and the abort failed", func() bool { return k.CommittedAll(t, group, "in") },
		func() string { return fmt.Sprintf("the inputs were not committed (stats %+v)", r.Stats()) })
	if r.Stats().LostPartitions == 0 {
		t.Fatal("no partition was lost: the test did not reach the failing abort")
	}
	if abortsFailed.Load() == 0 || reloads.Load() == 0 {
		t.Fatalf("%d aborts failed and %d producer reloads: the test did not reach the failing abort", abortsFailed.Load(), reloads.Load())
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, good)
}

// Ending a transaction fails with its outcome unknown (the coordinator
// failed over in the middle of the commit), and the producer ID reload
// that aborts it is answered PRODUCER_FENCED: Apache Kafka does so when
// the coordinator that took over no longer knows the epoch the commit
// bumped from. No other producer uses the transactional id. The runner
// reads back what the group committed (or, while the broker keeps the
// transaction open, gives up reading), starts a new session, as a
// restart would, and goes on: every output exactly once, and Run does
// not return. When the same happens again in the new session, Run
// returns an error wrapping txn.ErrFenced.
func TestFencedReloadAfterAFailedEndStartsANewSession(t *testing.T) {
	for i, tc := range []struct {
		name   string
		commit bool // the broker commits the transaction whose end fails
		again  bool // and the same happens in every new session
	}{
		{"the broker committed it", true, false},
		{"the broker left it open", false, false},
		{"again in the new session", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := setup(t)
			if k.Cluster == nil {
				t.Skip("the failing end and the fenced reload need the in-process kfake cluster")
			}
			group := "g-renew-" + strconv.Itoa(i)
			good := produceInputs(t, k, 300, 0)
			var armed, reloadFenced atomic.Bool
			var mu sync.Mutex
			var endingAt time.Time
			var freshInits atomic.Int32
			k.Cluster.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
				k.Cluster.KeepControl()
				r := req.(*kmsg.EndTxnRequest)
				mu.Lock()
				first := armed.Load() && endingAt.IsZero() && r.Commit
				if first {
					endingAt = time.Now()
				}
				failing := !first && !endingAt.IsZero() && !reloadFenced.Load()
				mu.Unlock()
				switch {
				case first && tc.commit:
					// Committed, and answered after the client gave up.
					k.Cluster.SleepControl(func() { time.Sleep(1500 * time.Millisecond) })
					return nil, nil, false
				case first || failing:
					resp := r.ResponseKind().(*kmsg.EndTxnResponse)
					resp.ErrorCode = kerr.CoordinatorLoadInProgress.Code
					return resp, nil, true
				}
				return nil, nil, false
			})
			k.Cluster.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
				k.Cluster.KeepControl()
				r := req.(*kmsg.InitProducerIDRequest)
				if r.ProducerID < 0 {
					if freshInits.Add(1) > 1 && tc.again {
						mu.Lock()
						endingAt = time.Time{} // the new session's next commit fails too
						reloadFenced.Store(false)
						mu.Unlock()
					}
					return nil, nil, false
				}
				mu.Lock()
				ending := !endingAt.IsZero()
				mu.Unlock()
				if !ending || !reloadFenced.CompareAndSwap(false, true) {
					return nil, nil, false
				}
				resp := r.ResponseKind().(*kmsg.InitProducerIDResponse)
				resp.ErrorCode = kerr.ProducerFenced.Code
				return resp, nil, true
			})
			cfg := config(k, group)
			cfg.ClientOptions = append(cfg.ClientOptions, kgo.RequestTimeoutOverhead(time.Second), kgo.RequestRetries(2))
			r, err := txn.New(cfg, txn.Options{TransactionalID: group + "-1", CommitInterval: 20 * time.Millisecond, TransactionTimeout: 3 * time.Second}, enrich)
			if err != nil {
				t.Fatal(err)
			}
			errc, cancel := runWatched(r)
			defer cancel()
			testenv.WaitFor(t, time.Minute, "a transaction committed", func() bool { return r.Stats().Commits > 0 })
			armed.Store(true)
			var late []*kgo.Record
			for i := range 300 {
				v := fmt.Sprintf("late-%05d", i)
				good = append(good, v)
				late = append(late, &kgo.Record{Topic: "in", Key: []byte(fmt.Sprintf("c%02d", i%17)), Value: []byte(v)})
			}
			if err := k.Produce(context.Background(), late...); err != nil {
				t.Fatal(err)
			}
			if tc.again {
				// A producer fenced again so soon after its session was
				// renewed stops the runner, as a real fence does;
				// nothing committed is duplicated.
				testenv.WaitFor(t, time.Minute, "a new session", func() bool { return freshInits.Load() >= 2 })
				var more []*kgo.Record
				for i := range 300 {
					more = append(more, &kgo.Record{Topic: "in", Key: []byte(fmt.Sprintf("c%02d", i%17)), Value: []byte(fmt.Sprintf("again-%05d", i))})
				}
				if err := k.Produce(context.Background(), more...); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-errc:
					if !errors.Is(err, txn.ErrFenced) || !strings.Contains(err.Error(), "renewed") {
						t.Fatalf("Run returned %v, want txn.ErrFenced saying the session was renewed", err)
					}
				case <-time.After(time.Minute):
					t.Fatalf("Run did not return after a second fence within a minute (%d fresh producer IDs)", freshInits.Load())
				}
				seen := map[string]bool{}
				for _, rec := range k.ReadAll(t, "out") {
					if seen[string(rec.Value)] {
						t.Fatalf("output %q committed twice", rec.Value)
					}
					seen[string(rec.Value)] = true
				}
				return
			}
			// The inputs all commit, and a new session starts (its
			// producer ID is initialised afresh), in either order.
			waitRunning(t, errc, "the fenced reload", func() bool {
				return r.Stats().Kafka.Records >= int64(len(good)) && k.CommittedAll(t, group, "in") && freshInits.Load() >= 2
			}, func() string {
				return fmt.Sprintf("%d producer IDs initialised afresh (want 2), reload fenced: %v, stats %+v", freshInits.Load(), reloadFenced.Load(), r.Stats())
			})
			if !reloadFenced.Load() {
				t.Fatal("no producer ID reload was fenced: the test did not reach the failing end")
			}
			cancel()
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			checkExactlyOnce(t, k, good)
		})
	}
}

// runWatched runs r; the channel receives what Run returns, and cancel
// stops it.
func runWatched(r *txn.Runner) (errc chan error, cancel context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	errc = make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	return errc, cancel
}

// waitRunning waits up to a minute for cond while Run keeps running: Run
// returning first (after what) or the minute passing (state says what
// was reached) fails the test.
func waitRunning(t *testing.T, errc <-chan error, after string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.After(time.Minute)
	for !cond() {
		select {
		case err := <-errc:
			t.Fatalf("Run returned after %s: %v", after, err)
		case <-deadline:
			t.Fatalf("after a minute: %s", state())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
