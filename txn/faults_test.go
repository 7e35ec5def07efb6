package txn_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// openTransaction leaves transactional id txnID with an open transaction
// that produced one record to "out" and committed group's offsets of
// topic's partitions at offset, as a member that died between its
// TxnOffsetCommit and its EndTxn leaves it. The client is closed when the
// test ends, without ending the transaction.
func openTransaction(t *testing.T, k *testenv.Kafka, txnID, group, topic string, partitions int32, offset int64, extra ...*kgo.Record) {
	t.Helper()
	ctx := context.Background()
	cl, err := k.Client(kgo.TransactionalID(txnID), kgo.TransactionTimeout(5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	recs := append([]*kgo.Record{{Topic: "out", Value: []byte("predecessor#a")}}, extra...)
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = txnID, id, epoch, group
	addResp, err := add.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(addResp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("AddOffsetsToTxn: %v", err)
	}
	oc := kmsg.NewPtrTxnOffsetCommitRequest()
	oc.TransactionalID, oc.Group, oc.ProducerID, oc.ProducerEpoch, oc.Generation = txnID, group, id, epoch, -1
	td, err := k.Admin().ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	ot := kmsg.NewTxnOffsetCommitRequestTopic()
	ot.Topic, ot.TopicID = topic, td[topic].ID
	for p := range partitions {
		op := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		op.Partition, op.Offset, op.LeaderEpoch = p, offset, -1
		ot.Partitions = append(ot.Partitions, op)
	}
	oc.Topics = append(oc.Topics, ot)
	ocResp, err := oc.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("TxnOffsetCommit: %v", err)
	}
	for _, rt := range ocResp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				t.Fatalf("TxnOffsetCommit %s[%d]: %v", rt.Topic, rp.Partition, err)
			}
		}
	}
}

// A member restarted after it died between committing its offsets and
// ending its transaction fences its predecessor and aborts that
// transaction at once, instead of waiting for the broker to time it out:
// it handles records promptly, the predecessor's output is never visible,
// and every input's outputs are there once.
func TestRestartFencesThePredecessorsOpenTransaction(t *testing.T) {
	k := setup(t)
	good := produceInputs(t, k, 30, 0)
	openTransaction(t, k, "restart-1", "g-restart", "in", 3, 0)

	r, err := txn.New(config(k, "g-restart"), txn.Options{TransactionalID: "restart-1", TransactionTimeout: 5 * time.Minute}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop := runFor(t, r)
	// Far below the five-minute transaction timeout the predecessor's
	// transaction would otherwise hold the group's offsets for.
	testenv.WaitFor(t, 20*time.Second, "every input handled", func() bool { return r.Stats().Records == 30 })
	t.Logf("handled every input %s after the start", time.Since(start).Round(time.Millisecond))
	testenv.WaitFor(t, 20*time.Second, "offsets committed", func() bool { return k.CommittedAll(t, "g-restart", "in") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, good)
}
