package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/outbox"
)

// An outbox name is part of every record's identity and of the wake-up a
// new row sends its relay, both split at '/': a Writer and a Relay refuse
// a name outside a-z A-Z 0-9 . _ - (at most 100), with an error that says
// what is allowed, and write nothing. A relay of an allowed name with
// every such character is woken by its rows: with a poll interval of an
// hour, its row is published at once.
func TestOutboxNamesAreValidated(t *testing.T) {
	ctx := context.Background()
	k, pool, _ := setup(t)
	for _, name := range []string{"orders/eu", "orders eu", "ümlaut", strings.Repeat("o", 101)} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Writer{Outbox: name}.Add(ctx, tx, &kgo.Record{Topic: "payments.booked", Value: []byte("v")})
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "a-z A-Z 0-9 . _ -") {
			t.Errorf("Writer{Outbox: %q}.Add returned %v, want an error saying which names are allowed", name, err)
		}
		var q dbscope.Queue
		if err := (outbox.Writer{Outbox: name}).Queue(&q, &kgo.Record{Topic: "payments.booked"}); err == nil || q.Len() != 0 {
			t.Errorf("Writer{Outbox: %q}.Queue returned %v and queued %d statements", name, err, q.Len())
		}
		if _, err := outbox.New(outbox.Options{Brokers: k.Brokers, Pool: pool, Outbox: name}); err == nil || !strings.Contains(err.Error(), "a-z A-Z 0-9 . _ -") {
			t.Errorf("a Relay of outbox %q: New returned %v, want an error saying which names are allowed", name, err)
		}
	}
	if n := outboxRows(t, pool); n != 0 {
		t.Fatalf("%d rows written under refused names", n)
	}

	const name = "orders.eu_1-b"
	w := outbox.Writer{Outbox: name, Partitions: 1}
	r, stop := runRelay(t, outbox.Options{Brokers: k.Brokers, Pool: pool, Outbox: name, Partitions: 1, OwnPartitions: []int{0},
		Logger: logger(), PollInterval: time.Hour})
	testenv.WaitFor(t, time.Minute, "the relay running", func() bool {
		st, err := r.Pending(ctx)
		return err == nil && len(st) == 1
	})
	addRows(t, pool, w, "payments.booked", "a", []byte("a/0"))
	caughtUp(t, r, 1, "the row published on its wake-up")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, ids := valuesOf(t, k, "payments.booked"); ids[name+"/0/1"] != 1 {
		t.Fatalf("published identities %v, want %s/0/1 once", ids, name)
	}
}
