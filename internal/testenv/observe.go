package testenv

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
)

// WaitFor polls cond until it holds or d passes. It waits on a condition
// with a deadline; it is not a sleep standing in for synchronisation.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// KeyedRecords returns perKey records for each of keys keys of topic, round
// robin over the keys so that a key's records interleave with others'. A
// record's key is "kNNN" and its value "kNNN/seq", seq counting from 0 per
// key.
func KeyedRecords(topic string, keys, perKey int) []*kgo.Record {
	recs := make([]*kgo.Record, 0, keys*perKey)
	for s := 0; s < perKey; s++ {
		for i := 0; i < keys; i++ {
			key := fmt.Sprintf("k%03d", i)
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(key + "/" + strconv.Itoa(s))})
		}
	}
	return recs
}

// ProduceKeyed produces KeyedRecords(topic, keys, perKey) and returns how
// many it wrote.
func (k *Kafka) ProduceKeyed(t testing.TB, topic string, keys, perKey int) int {
	t.Helper()
	recs := KeyedRecords(topic, keys, perKey)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for len(recs) > 0 {
		n := min(len(recs), 1000)
		if err := k.Produce(ctx, recs[:n]...); err != nil {
			t.Fatal(err)
		}
		recs = recs[n:]
	}
	return keys * perKey
}

// ProduceInTransactions writes perTxn records to each of topic's
// partitions in each of txns transactions of the transactional producer
// txnID, aborting transaction x when abort(x), and returns the values of
// the committed records. Each transaction leaves a marker after its
// records on every partition it wrote. Keys repeat over five values.
func (k *Kafka) ProduceInTransactions(t testing.TB, txnID, topic string, partitions int32, txns, perTxn int, abort func(x int) bool) (committed []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := k.Client(kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for x := range txns {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		var values []string
		for p := range partitions {
			for i := range perTxn {
				v := fmt.Sprintf("%s-txn%d-p%d-%02d", txnID, x, p, i)
				rec := &kgo.Record{Partition: p, Key: fmt.Appendf(nil, "k%d", i%5), Value: []byte(v)}
				if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
					t.Fatal(err)
				}
				values = append(values, v)
			}
		}
		commit := !abort(x)
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
		if commit {
			committed = append(committed, values...)
		}
	}
	return committed
}

// ParseKeyed splits a KeyedRecords value into its key and sequence number.
func ParseKeyed(value []byte) (key string, seq int, ok bool) {
	k, s, found := strings.Cut(string(value), "/")
	if !found {
		return "", 0, false
	}
	n, err := strconv.Atoi(s)
	return k, n, err == nil
}

// Observer records what handlers saw, in handling order, and detects two
// handlers running at once for one key.
type Observer struct {
	mu       sync.Mutex
	seqs     map[string][]int
	unique   map[string]bool
	handled  atomic.Int64
	active   sync.Map // key -> *atomic.Int32
	overlaps atomic.Int64
}

// NewObserver returns an empty Observer.
func NewObserver() *Observer {
	return &Observer{seqs: make(map[string][]int), unique: make(map[string]bool)}
}

// Enter marks the start of handling a record with key; the returned function
// marks its end. Two handlers inside for one key count as an overlap.
func (o *Observer) Enter(key []byte) (leave func()) {
	c, _ := o.active.LoadOrStore(string(key), new(atomic.Int32))
	n := c.(*atomic.Int32)
	if n.Add(1) != 1 {
		o.overlaps.Add(1)
	}
	return func() { n.Add(-1) }
}

// Record notes that a KeyedRecords value was handled.
func (o *Observer) Record(value []byte) {
	key, seq, _ := ParseKeyed(value)
	o.mu.Lock()
	o.seqs[key] = append(o.seqs[key], seq)
	o.unique[string(value)] = true
	o.mu.Unlock()
	o.handled.Add(1)
}

// Handled returns how many handlings were recorded, repeats included.
func (o *Observer) Handled() int64 { return o.handled.Load() }

// Unique returns how many distinct records were handled.
func (o *Observer) Unique() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.unique)
}

// Overlaps returns how many times two handlers ran at once for one key.
func (o *Observer) Overlaps() int64 { return o.overlaps.Load() }

// CheckStrictOrder fails t unless every key saw 0..perKey-1 exactly once, in
// order.
func (o *Observer) CheckStrictOrder(t testing.TB, keys, perKey int) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.seqs) != keys {
		t.Fatalf("saw %d keys, want %d", len(o.seqs), keys)
	}
	for k, s := range o.seqs {
		if len(s) != perKey {
			t.Fatalf("key %s: handled %d records, want %d: %v", k, len(s), perKey, s)
		}
		for i, v := range s {
			if v != i {
				t.Fatalf("key %s: out of order at %d: %v", k, i, s)
			}
		}
	}
}

// CheckOrderWithReplays fails t unless per-key order held under
// at-least-once redelivery: each handling of a key is of the next sequence
// number or of an earlier one (a redelivery from the last commit), never a
// skip ahead, and every sequence number 0..perKey-1 was handled.
func (o *Observer) CheckOrderWithReplays(t testing.TB, keys, perKey int) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.seqs) != keys {
		t.Fatalf("saw %d keys, want %d", len(o.seqs), keys)
	}
	for k, s := range o.seqs {
		seen := make([]bool, perKey)
		prev := -1
		for i, v := range s {
			if v > prev+1 {
				t.Fatalf("key %s: skipped from %d to %d at handling %d: %v", k, prev, v, i, s)
			}
			seen[v] = true
			prev = v
		}
		for v, ok := range seen {
			if !ok {
				t.Fatalf("key %s: record %d never handled (lost)", k, v)
			}
		}
	}
}

// CommittedAll reports whether group's committed offsets reach the end of
// every partition of topic; it fails t when the offsets cannot be read.
func (k *Kafka) CommittedAll(t testing.TB, group, topic string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := k.CommittedOffsets(ctx, group, topic); err != nil {
		t.Fatal(err)
	}
	return k.CaughtUp(ctx, group, topic)
}

// Stalls is a hook.StallHook that records the stalls a runner reports.
type Stalls struct {
	mu  sync.Mutex
	got []hook.Stall
}

// OnStall implements hook.StallHook.
func (s *Stalls) OnStall(st hook.Stall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, st)
}

// All returns the stalls and ends reported so far, in order.
func (s *Stalls) All() []hook.Stall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]hook.Stall(nil), s.got...)
}
