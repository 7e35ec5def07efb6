package boltscope_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	bolt "go.etcd.io/bbolt"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/devenv"
	"github.com/kscope-dev/kscope/examples/boltscope"
	"github.com/kscope-dev/kscope/retrytopic"
)

// testRun is one test's topic and group, on the cluster devenv gives
// (KAFKA_BROKERS, or an in-process one), removed when the test ends.
type testRun struct {
	t            *testing.T
	k            *devenv.Kafka
	adm          *kadm.Client
	topic, group string
	mu           sync.Mutex
	calls        map[string]int // handler calls per message id
}

func newTestRun(t *testing.T) *testRun {
	t.Helper()
	ctx := context.Background()
	k, err := devenv.StartKafka(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	name := devenv.RunName("boltscope-" + t.Name())
	tr := &testRun{t: t, k: k, adm: kadm.NewClient(cl), topic: name, group: name, calls: map[string]int{}}
	if _, err := tr.adm.CreateTopic(ctx, 1, -1, nil, tr.topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := k.Remove(ctx, tr.group, tr.topic); err != nil {
			t.Logf("removing the test's topics and group: %v", err)
		}
	})
	return tr
}

// produce produces records of key k with the message ids given, each with
// the headers of its entry in extra, if any.
func (tr *testRun) produce(ids []string, extra map[int][]kgo.RecordHeader) {
	tr.t.Helper()
	var recs []*kgo.Record
	for i, id := range ids {
		hs := append([]kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}, extra[i]...)
		recs = append(recs, &kgo.Record{Topic: tr.topic, Key: []byte("k"), Value: []byte(`{"Account":"a","Cents":1}`), Headers: hs})
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(tr.k.Brokers...))
	if err != nil {
		tr.t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		tr.t.Fatal(err)
	}
}

// count counts a handler call of r and returns the call's number.
func (tr *testRun) count(r *consumer.Record) int {
	id, _ := r.Header(consumer.DefaultMessageIDHeader)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.calls[string(id)]++
	return tr.calls[string(id)]
}

func (tr *testRun) callsOf(id string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.calls[id]
}

// deadLetters counts the records of the group's dead-letter topic.
func (tr *testRun) deadLetters() int64 {
	ends, err := tr.adm.ListEndOffsets(context.Background(), retrytopic.DLTopic(tr.group))
	if err != nil {
		return -1
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += max(o.Offset, 0) })
	return n
}

func (tr *testRun) config() consumer.Config {
	return consumer.Config{Brokers: tr.k.Brokers, Group: tr.group, Topics: []string{tr.topic}, CommitInterval: 20 * time.Millisecond,
		Failures: retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}}
}

// run runs r until stop is called, which returns Run's error (each time
// it is called).
func run(r *consumer.Runner) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() { cancel(); err = <-errc })
		return err
	}
}

// waitFor waits until cond holds, failing t after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ledgerEntries(t *testing.T, db *bolt.DB) int {
	t.Helper()
	n, err := ledgerPipeline(nil).Effects(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// An identity's outcome is its first copy's: a copy of a dead-lettered
// record is a duplicate, unless an operator redrove it, which applies it;
// a business skip commits the handler's writes and its copy is a
// duplicate; a handler that panics fails its record, which is
// dead-lettered after the unknown budget, with nothing written.
func TestOutcomesOfAnIdentity(t *testing.T) {
	tr := newTestRun(t)
	db := openFile(t)
	r, err := boltscope.New(tr.config(), db, boltscope.HandlerFunc(func(ctx context.Context, tx *bolt.Tx, r *consumer.Record) error {
		n := tr.count(r)
		id, _ := r.Header(consumer.DefaultMessageIDHeader)
		switch string(id) {
		case "dead-1":
			if n == 1 {
				return consumer.Terminal(errors.New("refused"))
			}
		case "skip-1":
			if err := applyPayment(ctx, tx, r); err != nil {
				return err
			}
			return consumer.Skip(errors.New("a business rejection, written down"))
		case "panic-1":
			panic("the handler's bug")
		}
		return applyPayment(ctx, tx, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	redrive := []kgo.RecordHeader{{Key: retrytopic.HeaderRedrive, Value: []byte("redriven by the test")}}
	tr.produce([]string{"dead-1", "dead-1", "dead-1", "skip-1", "skip-1", "panic-1"}, map[int][]kgo.RecordHeader{2: redrive})
	stop := run(r)
	waitFor(t, "the six records done", func() bool { return r.Stats().Done >= 6 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := r.Stats()
	if got := ledgerEntries(t, db); got != 2 {
		t.Errorf("%d ledger entries, want 2 (the redriven record and the skipped one)", got)
	}
	if a, b, c := tr.callsOf("dead-1"), tr.callsOf("skip-1"), tr.callsOf("panic-1"); a != 2 || b != 1 || c != retrytopic.DefaultUnknownAttempts {
		t.Errorf("handler calls: dead-1 %d, skip-1 %d, panic-1 %d; want 2 (first copy, redrive), 1, %d", a, b, c, retrytopic.DefaultUnknownAttempts)
	}
	if n := tr.deadLetters(); n != 2 || st.Failures.DeadLettered != 2 {
		t.Errorf("%d dead letters (%d counted), want 2: dead-1 once, panic-1", n, st.Failures.DeadLettered)
	}
	if st.DB.Duplicates != 2 || st.DB.Skipped != 1 || st.DB.Applied != 1 {
		t.Errorf("counters: %d duplicates, %d skipped, %d applied; want 2, 1, 1", st.DB.Duplicates, st.DB.Skipped, st.DB.Applied)
	}
}

// An error of the file is no record's fault: the key-shard holds (in
// Stats().Hold), nothing is dead-lettered, and the record stays undone.
func TestFileErrorHoldsTheKeyShard(t *testing.T) {
	tr := newTestRun(t)
	db, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	r, err := boltscope.New(tr.config(), db, boltscope.HandlerFunc(func(ctx context.Context, tx *bolt.Tx, r *consumer.Record) error {
		tr.count(r)
		return applyPayment(ctx, tx, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(r)
	defer stop()
	tr.produce([]string{"before"}, nil)
	waitFor(t, "the first record done", func() bool { return r.Stats().Done >= 1 })
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	tr.produce([]string{"after"}, nil)
	waitFor(t, "the key-shard holding", func() bool { return r.Stats().Hold.Shards == 1 })
	st := r.Stats()
	if !strings.Contains(st.Hold.Err, "database not open") || st.DB.TxRetries == 0 {
		t.Errorf("hold error %q, %d transactions retried; want bbolt's \"database not open\", retried", st.Hold.Err, st.DB.TxRetries)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st := r.Stats(); st.Done != 1 || tr.deadLetters() != 0 || tr.callsOf("after") != 0 {
		t.Errorf("after the file closed: %d records done, %d dead letters, %d calls of the record behind; want 1, 0, 0", st.Done, tr.deadLetters(), tr.callsOf("after"))
	}
}
