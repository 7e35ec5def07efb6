package outbox_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/outbox"
)

// holdCommits refuses every transaction commit until the returned handle
// is removed: the relay's transaction that carries the position past a
// dead-lettered row cannot commit meanwhile.
func holdCommits(t *testing.T, k *testenv.Kafka) *kfake.FaultHandle {
	t.Helper()
	h, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.InvalidTxnState, Count: -1,
		When: func(req kmsg.Request) bool { return req.(*kmsg.EndTxnRequest).Commit }})
	if err != nil {
		t.Skip(err) // broker faults need the in-process kfake cluster
	}
	t.Cleanup(h.Remove)
	return h
}

// An operator requeues a dead-lettered row before the relay's transaction
// that moves the partition's position past it commits (the documented
// workflow: fix the cause, then requeue), and that transaction does not
// commit: the relay stops (restart) or goes on after it failed (same
// run). The row is published once, as its requeued copy, and the
// dead-letter table is empty: the refused row left the outbox when it
// became dead, so it is neither published again nor dead-lettered again.
func TestRequeueBeforeThePositionPassedTheDeadRow(t *testing.T) {
	for _, restart := range []bool{true, false} {
		name := "same run"
		if restart {
			name = "restart"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			k, pool, _ := setup(t)
			w := outbox.Writer{Partitions: 1}
			o := outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0},
				Logger: logger(), PollInterval: 20 * time.Millisecond}
			if restart {
				// Kafka refuses the row as too large until the limit is
				// raised (a relay started without it).
				o.ClientOptions = []kgo.Opt{kgo.ProducerBatchMaxBytes(64 << 10)}
			}
			addRows(t, pool, w, "payments.booked", "a", []byte("a/0"))
			r, stop := runRelay(t, o)
			caughtUp(t, r, 1, "the first row published")
			h := holdCommits(t, k)
			if restart {
				addRows(t, pool, w, "payments.booked", "a", bytes.Repeat([]byte("x"), 100<<10))
			} else {
				// A topic name Kafka does not allow: refused without asking.
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := w.Add(ctx, tx, &kgo.Record{Topic: "payments.booked", Key: []byte("a"), Value: []byte("misnamed")}); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `UPDATE kscope_outbox SET topic = 'payments booked!' WHERE seq = 2`)
					return err
				}); err != nil {
					t.Fatal(err)
				}
			}
			testenv.WaitFor(t, time.Minute, "the refused row dead-lettered", func() bool { return len(deadRows(t, pool)) == 1 })
			if err := h.Wait(ctx, 1); err != nil {
				t.Fatal(err)
			}
			topic := ""
			if !restart {
				topic = "payments.booked"
			}
			q, err := outbox.DeadLetters{DB: pool}.Requeue(ctx, "default/0/2", topic)
			if err != nil {
				t.Fatal(err)
			}
			if restart {
				if err := stop(); err != nil {
					t.Fatal(err)
				}
				o.ClientOptions = nil // the cause fixed
				r, stop = runRelay(t, o)
			}
			h.Remove()
			caughtUp(t, r, q.Seq, "the requeued row published")
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			values, ids := valuesOf(t, k, "payments.booked")
			if len(values) != 2 || values[0] != "a/0" || ids["default/0/2"] != 1 {
				short := make([]string, len(values))
				for i, v := range values {
					short[i] = v[:min(len(v), 12)]
				}
				t.Fatalf("published %q with identities %v, want a/0 and the requeued row once", short, ids)
			}
			if d := deadRows(t, pool); len(d) != 0 {
				t.Errorf("dead-letter table %+v after the requeued row was published, want it empty", d)
			}
		})
	}
}
