package txn_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/partition"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/txn"
)

// stuckSetup creates topic "one" (one partition, so that every key shares
// it) and produces, round robin, perKey records of the key "stuck" and of
// keys k00..k(keys-1): value "<key>/<seq>"; in transactions of perTxn
// records, each ending in a marker, when perTxn is positive. It returns
// the keys whose key-shard differs from stuck's under cfg, which must not
// wait for it.
func stuckSetup(t *testing.T, k *testenv.Kafka, cfg consumer.Config, keys, perKey, perTxn int) (free []string, total int) {
	t.Helper()
	if err := k.CreateTopic(context.Background(), "one", 1); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for s := range perKey {
		recs = append(recs, &kgo.Record{Topic: "one", Key: []byte("stuck"), Value: []byte(fmt.Sprintf("stuck/%d", s))})
		for i := range keys {
			key := fmt.Sprintf("k%02d", i)
			recs = append(recs, &kgo.Record{Topic: "one", Key: []byte(key), Value: []byte(fmt.Sprintf("%s/%d", key, s))})
		}
	}
	if perTxn > 0 {
		produceInTransactions(t, k, recs, perTxn)
	} else if err := k.Produce(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	stuck := partition.Shard("one", 0, 0, []byte("stuck"), cfg.Shards, cfg.NullKeys)
	for i := range keys {
		key := fmt.Sprintf("k%02d", i)
		if partition.Shard("one", 0, 0, []byte(key), cfg.Shards, cfg.NullKeys) != stuck {
			free = append(free, key)
		}
	}
	return free, len(recs)
}

// produceInTransactions produces recs, in order, in committed
// transactions of perTxn records, as an upstream exactly-once pipeline
// does.
func produceInTransactions(t *testing.T, k *testenv.Kafka, recs []*kgo.Record, perTxn int) {
	t.Helper()
	ctx := context.Background()
	cl, err := k.Client(kgo.TransactionalID("upstream"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for len(recs) > 0 {
		n := min(perTxn, len(recs))
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, recs[:n]...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
		recs = recs[n:]
	}
}

// echo emits "<value>" to "out" for every input, unless fail says the
// input fails; it counts the attempts per value.
type echo struct {
	mu       sync.Mutex
	attempts map[string]int
	fail     func(value string) bool
}

func (e *echo) Handle(_ context.Context, r *consumer.Record, out txn.Emitter) error {
	v := string(r.Value)
	e.mu.Lock()
	e.attempts[v]++
	e.mu.Unlock()
	if e.fail(v) {
		return consumer.Retryable(errors.New("gateway 503"))
	}
	out.Emit(&kgo.Record{Topic: "out", Key: r.Key, Value: r.Value})
	return nil
}

func (e *echo) tries(v string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.attempts[v]
}

func stuckConfig(k *testenv.Kafka, group string) consumer.Config {
	cfg := config(k, group)
	cfg.Topics = []string{"one"}
	cfg.Shards = 8
	// A retry budget of 25s at least: longer than the waits below.
	cfg.Failures = retrytopic.Policy{Backoff: 50 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, RetryableAttempts: retrytopic.MaxAttempt}
	return cfg
}

// checkOutputs reads "out" read_committed and checks that every value in
// want is there exactly once, nothing else is, and each key's values come
// in their produced order.
func checkOutputs(t *testing.T, k *testenv.Kafka, want int) {
	t.Helper()
	seen := map[string]int{}
	next := map[string]int{}
	for _, r := range k.ReadAll(t, "out") {
		v := string(r.Value)
		seen[v]++
		if seen[v] > 1 {
			t.Fatalf("output %q seen twice read_committed", v)
		}
		key, seq, _ := strings.Cut(v, "/")
		if fmt.Sprint(next[key]) != seq {
			t.Fatalf("key %s: output %q where %s/%d was due: per-key order broken", key, v, key, next[key])
		}
		next[key]++
	}
	if len(seen) != want {
		t.Fatalf("%d distinct outputs read_committed, want %d", len(seen), want)
	}
}

// A key whose record retries in place holds its key-shard and nothing
// else: the records of the other keys, later ones of the same partition
// included, commit while it retries, and once it succeeds its own records
// follow in order.
func TestOneRetryingKeyHoldsOnlyItsShard(t *testing.T) {
	k := setup(t)
	cfg := stuckConfig(k, "g-stuck")
	free, total := stuckSetup(t, k, cfg, 24, 3, 0)
	var released atomic.Bool
	h := &echo{attempts: map[string]int{}, fail: func(v string) bool { return v == "stuck/0" && !released.Load() }}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "stuck-1"}, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, 10*time.Second, "the other key-shards' records committed while stuck/0 retries", func() bool {
		return r.Stats().Kafka.Records >= int64(3*len(free))
	})
	if h.tries("stuck/0") < 2 {
		t.Fatalf("stuck/0 tried %d times; it should still be retrying", h.tries("stuck/0"))
	}
	checkOutputs(t, k, int(r.Stats().Kafka.Outputs))
	released.Store(true)
	testenv.WaitFor(t, 20*time.Second, "every record committed", func() bool { return r.Stats().Kafka.Records == int64(total) })
	testenv.WaitFor(t, 20*time.Second, "offsets committed", func() bool { return k.CommittedAll(t, "g-stuck", "one") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkOutputs(t, k, total)
}

// A member closed while a key retries, with later records of the same
// partition committed past it, hands the partition over with the offset
// at the retrying record and, in the offset's metadata, the records after
// it that are done: the next member handles the retrying record and what
// waited behind it, and none of the done ones again. Read read_committed,
// nothing is duplicated or lost and every key's outputs are in order.
func TestRetryingKeyAcrossRestart(t *testing.T) {
	k := setup(t)
	cfg := stuckConfig(k, "g-stuck-restart")
	free, total := stuckSetup(t, k, cfg, 24, 3, 0)
	h := &echo{attempts: map[string]int{}, fail: func(v string) bool { return v == "stuck/0" }}
	r1, err := txn.New(cfg, txn.Options{TransactionalID: "stuck-restart-1"}, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r1)
	testenv.WaitFor(t, 10*time.Second, "the other key-shards' records committed while stuck/0 retries", func() bool {
		return r1.Stats().Kafka.Records >= int64(3*len(free))
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	done := r1.Stats().Kafka.Records
	com, err := k.CommittedOffsets(context.Background(), "g-stuck-restart", "one")
	if err != nil {
		t.Fatal(err)
	}
	if com[0] != 0 {
		t.Fatalf("committed offset %d passed the retrying record at 0", com[0])
	}

	h.fail = func(string) bool { return false }
	r2, err := txn.New(cfg, txn.Options{TransactionalID: "stuck-restart-1"}, h)
	if err != nil {
		t.Fatal(err)
	}
	stop = runFor(t, r2)
	testenv.WaitFor(t, 20*time.Second, "the rest committed by the next member", func() bool {
		return r2.Stats().Kafka.Records >= int64(total)-done
	})
	testenv.WaitFor(t, 20*time.Second, "offsets committed", func() bool { return k.CommittedAll(t, "g-stuck-restart", "one") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkOutputs(t, k, total)
	for _, key := range free {
		for s := range 3 {
			if n := h.tries(fmt.Sprintf("%s/%d", key, s)); n != 1 {
				t.Fatalf("%s/%d handled %d times, want once: the next member handled a done record again", key, s, n)
			}
		}
	}
}

// A transaction that stays open longer than TransactionTimeout (here an
// EndTxn the broker is slow to answer) is aborted by the broker, which
// fences the producer: Run says that the transaction timed out, not that
// another producer took the transactional id.
func TestTransactionTimeoutIsReportedAsSuch(t *testing.T) {
	k := setup(t)
	if k.Cluster == nil {
		t.Skip("needs the in-process broker to delay EndTxn")
	}
	produceInputs(t, k, 10, 0)
	adm := kadm.NewClient(mustClient(t, k))
	var slowed atomic.Bool
	k.Cluster.ControlKey(int16(kmsg.EndTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
		if slowed.Swap(true) {
			return nil, nil, false
		}
		k.Cluster.SleepControl(func() {
			// Answer once the broker has timed the transaction out.
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				d, err := adm.DescribeTransactions(context.Background(), "timeout-1")
				if err == nil {
					if s, ok := d["timeout-1"]; ok && s.State != "Ongoing" {
						return
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
		return nil, nil, false
	})
	r, err := txn.New(config(k, "g-timeout"), txn.Options{TransactionalID: "timeout-1", TransactionTimeout: time.Second}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	select {
	case err := <-errc:
		if !errors.Is(err, txn.ErrTransactionTimedOut) || errors.Is(err, txn.ErrFenced) || !strings.Contains(err.Error(), "TransactionTimeout") {
			t.Fatalf("Run returned %v; want an error that names the transaction timeout", err)
		}
		t.Log(err)
	case <-time.After(time.Minute):
		r.Close()
		t.Fatal("Run kept running after its transaction timed out")
	}
}

func mustClient(t *testing.T, k *testenv.Kafka) *kgo.Client {
	t.Helper()
	cl, err := k.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// A key retrying in place while far more records of its partition than
// commit.MaxUndone pass it: the partition's records wait once that many
// are dispatched and not done, so the committed offset's metadata lists at
// most that many, within the broker's metadata limit. The next member
// skips every record whose outputs committed, and read_committed nothing
// is duplicated or lost.
//
// So also when the input was written in transactions, each ending in a
// marker: a marker is counted done only once the records held back
// before it are dispatched. Counted done at once, a marker above the held
// records made every transaction list them all as undone, metadata the
// broker refuses past offset.metadata.max.bytes (4096 by default), and
// every transaction aborted.
func TestRetryingKeyPastTheUndoneBound(t *testing.T) {
	t.Run("plain input", func(t *testing.T) { testRetryingKeyPastTheUndoneBound(t, 64, 60, 0) })
	t.Run("input written in transactions", func(t *testing.T) { testRetryingKeyPastTheUndoneBound(t, 64, 100, 10) })
}

func testRetryingKeyPastTheUndoneBound(t *testing.T, keys, perKey, perTxn int) {
	k := setup(t)
	cfg := stuckConfig(k, "g-stuck-bound")
	_, total := stuckSetup(t, k, cfg, keys, perKey, perTxn)
	h1 := &echo{attempts: map[string]int{}, fail: func(v string) bool { return v == "stuck/0" }}
	r1, err := txn.New(cfg, txn.Options{TransactionalID: "stuck-bound-1"}, h1)
	if err != nil {
		t.Fatal(err)
	}
	// Once MaxUndone records of stuck's key-shard (stuck/0 and those
	// waiting behind it) are dispatched, nothing more is: every record of
	// another key-shard before the last of them commits, and no later
	// record does.
	stuckShard := partition.Shard("one", 0, 0, []byte("stuck"), cfg.Shards, cfg.NullKeys)
	behind, passing := 0, 0
	for s := 0; behind < commit.MaxUndone; s++ {
		for i := -1; i < keys && behind < commit.MaxUndone; i++ {
			key := "stuck"
			if i >= 0 {
				key = fmt.Sprintf("k%02d", i)
			}
			if partition.Shard("one", 0, 0, []byte(key), cfg.Shards, cfg.NullKeys) == stuckShard {
				behind++
			} else {
				passing++
			}
		}
	}
	stop := runFor(t, r1)
	testenv.WaitFor(t, 20*time.Second, "the records before the bound of unfinished records committed", func() bool {
		st := r1.Stats()
		return st.Held > 0 && st.Kafka.Records >= int64(passing)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	resp, err := k.Admin().FetchOffsets(context.Background(), "g-stuck-bound")
	if err != nil {
		t.Fatal(err)
	}
	o, ok := resp.Lookup("one", 0)
	if !ok || o.Err != nil || o.At != 0 {
		t.Fatalf("committed offset of one[0]: %+v; want 0, the retrying record", o)
	}
	d, err := commit.ParseDone(o.At, o.Metadata)
	if err != nil || len(o.Metadata) > 4096 || len(d.Undone) > commit.MaxUndone || d.End <= d.Offset {
		t.Fatalf("metadata %d bytes, %d undone, done up to %d (%v); want at most 4096 bytes and %d undone",
			len(o.Metadata), len(d.Undone), d.End, err, commit.MaxUndone)
	}
	committed := map[string]bool{}
	for _, r := range k.ReadAll(t, "out") {
		committed[string(r.Value)] = true
	}
	if len(committed) != passing {
		t.Fatalf("%d outputs committed before the bound; want %d: the other key-shards' records up to the bound", len(committed), passing)
	}

	h2 := &echo{attempts: map[string]int{}, fail: func(string) bool { return false }}
	r2, err := txn.New(cfg, txn.Options{TransactionalID: "stuck-bound-1"}, h2)
	if err != nil {
		t.Fatal(err)
	}
	stop = runFor(t, r2)
	testenv.WaitFor(t, 30*time.Second, "offsets committed", func() bool { return k.CommittedAll(t, "g-stuck-bound", "one") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkOutputs(t, k, total)
	for v := range committed {
		if n := h2.tries(v); n != 0 {
			t.Fatalf("%s handled again by the next member, whose output committed before", v)
		}
	}
}
