package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/outbox"
)

// Add and Queue refuse, in the writer's transaction, a record the relay
// could not publish: larger than Writer.MaxRecordBytes (key, value and
// headers), or to a topic name Kafka does not allow. A negative
// MaxRecordBytes turns the size check off.
func TestWriterRefusesRecordsTheRelayCannotPublish(t *testing.T) {
	ctx := context.Background()
	_, pool, _ := setup(t)
	add := func(w outbox.Writer, rec *kgo.Record) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.Add(ctx, tx, rec)
			return err
		})
	}
	big := make([]byte, outbox.DefaultMaxRecordBytes+1)
	if err := add(outbox.Writer{}, &kgo.Record{Topic: "payments.booked", Value: big}); err == nil || !strings.Contains(err.Error(), "MaxRecordBytes") {
		t.Errorf("a record over DefaultMaxRecordBytes: Add returned %v, want an error naming MaxRecordBytes", err)
	}
	small := outbox.Writer{MaxRecordBytes: 100}
	withHeaders := &kgo.Record{Topic: "payments.booked", Key: make([]byte, 60), Headers: []kgo.RecordHeader{{Key: "trace", Value: make([]byte, 40)}}}
	if err := add(small, withHeaders); err == nil || !strings.Contains(err.Error(), "MaxRecordBytes") {
		t.Errorf("a record whose key and headers pass MaxRecordBytes: Add returned %v", err)
	}
	var q dbscope.Queue
	if err := small.Queue(&q, withHeaders); err == nil || !strings.Contains(err.Error(), "MaxRecordBytes") || q.Len() != 0 {
		t.Errorf("Queue of an oversized record returned %v and queued %d statements", err, q.Len())
	}
	for _, topic := range []string{"payments booked", "..", strings.Repeat("t", 250)} {
		if err := add(outbox.Writer{}, &kgo.Record{Topic: topic, Value: []byte("v")}); err == nil || !strings.Contains(err.Error(), "topic") {
			t.Errorf("topic %q: Add returned %v, want an error about the topic name", topic, err)
		}
	}
	rows := func() (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM kscope_outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := rows(); n != 0 {
		t.Fatalf("%d refused rows in the outbox", n)
	}
	if err := add(outbox.Writer{MaxRecordBytes: -1}, &kgo.Record{Topic: "payments.booked", Value: big}); err != nil {
		t.Errorf("MaxRecordBytes -1: %v", err)
	}
	if n := rows(); n != 1 {
		t.Fatalf("%d rows in the outbox, want the one written without a size check", n)
	}
}
