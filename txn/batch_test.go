package txn_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/txn"
)

// batchEcho is a batch handler that emits each input's value to "out" and
// fails records by their value: "a/1" is poison (FailedAt, to the DLT),
// "b/1" fails twice as retryable (FailedAt), "c/1" makes the first call
// that reaches it fail with a plain error and "d/1" panic.
type batchEcho struct {
	mu    sync.Mutex
	seen  map[string]int
	sizes []int
}

func (h *batchEcho) HandleBatch(_ context.Context, recs []*consumer.Record, out txn.BatchEmitter) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sizes = append(h.sizes, len(recs))
	for i, r := range recs {
		v := string(r.Value)
		h.seen[v]++ // calls that reached the record
		out.Emit(i, &kgo.Record{Topic: "out", Key: r.Key, Value: r.Value})
		switch {
		case v == "a/1":
			return consumer.FailedAt(i, consumer.DecodeError(errors.New("not JSON")))
		case v == "b/1" && h.seen[v] < 3:
			return consumer.FailedAt(i, consumer.Retryable(errors.New("gateway 503")))
		case v == "c/1" && h.seen[v] == 1:
			return errors.New("the batch's call broke")
		case v == "d/1" && h.seen[v] == 1:
			panic("a bad record")
		}
	}
	return nil
}

// A batch handler's outputs commit exactly once with their inputs'
// offsets, each record's by its own outcome: the records before a FailedAt
// keep their outputs, the failed record is routed alone (the poison one to
// the DLT, in the transaction; the flaky one retried in place, the handler
// given it alone), and a plain error or a panic has the batch handled
// again one record at a time. Per-key order holds in the outputs.
func TestBatchHandlerOutputsCommitOncePerRecord(t *testing.T) {
	k := setup(t)
	var recs []*kgo.Record
	var want []string
	for seq := range 4 {
		for _, key := range []string{"a", "b", "c", "d", "e", "f"} {
			v := fmt.Sprintf("%s/%d", key, seq)
			recs = append(recs, &kgo.Record{Topic: "in", Key: []byte(key), Value: []byte(v), Partition: 0})
			if v != "a/1" {
				want = append(want, v)
			}
		}
	}
	if err := k.Produce(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	h := &batchEcho{seen: map[string]int{}}
	cfg := config(k, "g-batch")
	cfg.Shards = 1
	cfg.Failures.DisableRetryTopics = true
	r, err := txn.NewBatch(cfg, txn.Options{TransactionalID: "batch-1"}, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, 30*time.Second, "every record committed", func() bool { return r.Stats().Kafka.Records == int64(len(recs)) })
	testenv.WaitFor(t, 30*time.Second, "offsets committed", func() bool { return k.CommittedAll(t, "g-batch", "in") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	var got []string
	for _, o := range k.ReadAll(t, "out") {
		v := string(o.Value)
		got = append(got, v)
		key, seq, _ := strings.Cut(v, "/")
		n, err := strconv.Atoi(seq)
		if err != nil {
			t.Fatalf("output %q is not key/seq", v)
		}
		if p, ok := last[key]; ok && n <= p {
			t.Fatalf("key %s: output %s after %s/%d: per-key order broken or a duplicate", key, v, key, p)
		}
		last[key] = n
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("outputs read_committed %v, want each of %v once", got, want)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic("g-batch"))
	if len(dlt) != 1 || string(dlt[0].Value) != "a/1" {
		t.Fatalf("DLT holds %d records, want a/1 alone", len(dlt))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !slices.ContainsFunc(h.sizes, func(n int) bool { return n > 1 }) || !slices.Contains(h.sizes, 1) {
		t.Fatalf("call sizes %v: want batches and one-record calls", h.sizes)
	}
	if h.seen["b/1"] != 3 {
		t.Fatalf("b/1 reached by %d calls, want 3", h.seen["b/1"])
	}
}

func TestNewBatchRefusesANilHandler(t *testing.T) {
	_, err := txn.NewBatch(consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}}, txn.Options{TransactionalID: "x"}, nil)
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("NewBatch(nil) = %v, want a *consumer.ConfigError", err)
	}
}
