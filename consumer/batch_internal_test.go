package consumer

import (
	"context"
	"testing"
)

// The AtLeastOnce scope takes queued records in batches (its handler still
// sees one record at a time): the per-record hand-off cost is what the r1
// benchmark measures.
func TestAtLeastOnceTakesBatches(t *testing.T) {
	r, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}},
		HandlerFunc(func(context.Context, *Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if r.maxBatch != atLeastOnceBatch || r.linger != 0 {
		t.Fatalf("AtLeastOnce batches of %d records, linger %s; want %d, no linger", r.maxBatch, r.linger, atLeastOnceBatch)
	}
}
