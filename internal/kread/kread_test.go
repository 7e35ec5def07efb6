package kread_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/kread"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// produceTxn writes values to partition 0 of topic in one transaction,
// committed or aborted: the markers and the aborted records take offsets
// that are not data.
func produceTxn(t *testing.T, k *testenv.Kafka, topic string, commit bool, values ...string) {
	t.Helper()
	cl, err := k.Client(kgo.TransactionalID("kread-"+topic), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

func reader(t *testing.T, k *testenv.Kafka, topic string) *kgo.Client {
	t.Helper()
	cl, err := k.Client(kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// A partition that ends with an aborted transaction's marker is read to
// its end, with the committed data only; an empty partition is not waited
// for.
func TestToEndSkipsMarkersAndAbortedRecords(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k.CreateTopic(ctx, "log", 2); err != nil {
		t.Fatal(err)
	}
	produceTxn(t, k, "log", true, "a", "b")
	produceTxn(t, k, "log", false, "x", "y")
	ends, err := k.EndOffsets(ctx, "log")
	if err != nil {
		t.Fatal(err)
	}
	if ends[0] != 6 || ends[1] != 0 {
		t.Fatalf("end offsets %v, want 6 for partition 0 (2 records, 2 aborted, 2 markers) and 0", ends)
	}
	var got []string
	err = kread.ToEnd(ctx, reader(t, k, "log"), map[string]map[int32]int64{"log": ends}, kread.Options{}, func(r *kgo.Record) error {
		got = append(got, string(r.Value))
		return nil
	})
	if err != nil || fmt.Sprint(got) != "[a b]" {
		t.Fatalf("read %v, %v; want [a b], nil", got, err)
	}

	// Up to an end below the last offset: only what is before it.
	got = nil
	err = kread.ToEnd(ctx, reader(t, k, "log"), map[string]map[int32]int64{"log": {0: 1}}, kread.Options{}, func(r *kgo.Record) error {
		got = append(got, string(r.Value))
		return nil
	})
	if err != nil || fmt.Sprint(got) != "[a]" {
		t.Fatalf("read %v, %v; want [a], nil", got, err)
	}
}

// An end that the partition does not reach ends the read with an
// IdleError naming where it stopped, not a hang; fn's error ends it too.
func TestToEndErrors(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k.CreateTopic(ctx, "short", 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: "short", Value: []byte("only")}); err != nil {
		t.Fatal(err)
	}
	err := kread.ToEnd(ctx, reader(t, k, "short"), map[string]map[int32]int64{"short": {0: 5}}, kread.Options{Idle: 300 * time.Millisecond},
		func(*kgo.Record) error { return nil })
	var idle *kread.IdleError
	if !errors.As(err, &idle) || idle.Offset != 1 || idle.End != 5 {
		t.Fatalf("got %v, want an IdleError at offset 1 of 5", err)
	}

	stop := errors.New("stop")
	err = kread.ToEnd(ctx, reader(t, k, "short"), map[string]map[int32]int64{"short": {0: 1}}, kread.Options{}, func(*kgo.Record) error { return stop })
	if !errors.Is(err, stop) {
		t.Fatalf("got %v, want fn's error", err)
	}
}
