package kscopetest

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
)

// A batch call that fails at its first record did not run the records
// after it: when the scope calls them again, that is their first run, not
// a repeat (the kit once reported the good record of the undecodable
// scenario as handled twice when it shared a batch after the bad one).
func TestBatchRecordsAfterTheFailureAreNotRepeats(t *testing.T) {
	rec := func(id string) *consumer.Record {
		return &consumer.Record{Record: &kgo.Record{Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("p-" + id)}}}}
	}
	bad, good := rec("bad"), rec("good")
	for _, rolledBack := range []bool{true, false} {
		in := newInjector("p-")
		_ = in.batch([]*consumer.Record{bad, good}, "id", rolledBack, func([]*consumer.Record) error {
			return consumer.FailedAt(0, consumer.DecodeError(errors.New("not an order")))
		})
		_ = in.batch([]*consumer.Record{good}, "id", rolledBack, func([]*consumer.Record) error { return nil })
		if r := in.repeats(); len(r) != 0 {
			t.Fatalf("rolledBack=%v: %s", rolledBack, repeatsDetail(r))
		}
		if n := in.callsOf("good"); n != 1 {
			t.Fatalf("rolledBack=%v: good called %d times, want 1", rolledBack, n)
		}
	}
}
