package outbox_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/outbox"
)

// startChild starts a child relay (this test binary again) publishing
// every partition of an outbox of parts partitions, and waits until it
// runs.
func startChild(t *testing.T, k *testenv.Kafka, url string, parts int) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(parts), "KAFKA_BROKERS="+strings.Join(k.Brokers, ","), "DATABASE_URL="+url)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "READY\n" {
		t.Fatalf("child relay: %q %v", line, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck
	return cmd
}

// A relay killed after it moved a row Kafka refused to the dead-letter
// table and before the transaction that carries the position past it
// committed: the relay that goes on finds the row in the dead-letter
// table and moves the position past it, without publishing it, even
// though Kafka would take it now (the refusal has passed). Published, it
// would be both on the topic and in the dead-letter table, as a row never
// published, for an operator to requeue: twice on the topic.
func TestRelayKilledAfterADeadLetterDoesNotPublishTheDeadRow(t *testing.T) {
	k, pool, url := setup(t)
	if k.Cluster == nil {
		t.Skip("catching the commit needs the in-process kfake cluster")
	}
	w := outbox.Writer{Partitions: 1}
	addRows(t, pool, w, "payments.booked", "a", []byte("a/refused"))
	// The broker refuses the row each time it is sent (alone): the relay
	// dead-letters it, then commits a transaction with its position only.
	if _, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "payments.booked", Err: kerr.MessageTooLarge, Count: 3}); err != nil {
		t.Fatal(err)
	}
	var child atomic.Pointer[exec.Cmd]
	killed := make(chan struct{})
	var caught atomic.Bool
	k.Cluster.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if !req.(*kmsg.EndTxnRequest).Commit || caught.Swap(true) {
			return nil, nil, false
		}
		k.Cluster.DropControl()
		if cmd := child.Load(); cmd != nil {
			cmd.Process.Kill() //nolint:errcheck // the test fails below if it lives
			cmd.Wait()         //nolint:errcheck // killed
		}
		close(killed)
		return nil, errors.New("the relay is gone"), true
	})
	child.Store(startChild(t, k, url, 1))
	select {
	case <-killed:
	case <-time.After(time.Minute):
		t.Fatal("the child relay never committed")
	}
	if dead := deadRows(t, pool); len(dead) != 1 || dead[0].id != "default/0/1" {
		t.Fatalf("dead-letter rows %+v, want default/0/1", dead)
	}
	addRows(t, pool, w, "payments.booked", "a", []byte("a/after"))
	o := outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0}, Logger: logger(),
		PollInterval: 20 * time.Millisecond}
	r, stop := runRelay(t, o)
	caughtUp(t, r, 2, "the row after the dead one published")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	values, ids := valuesOf(t, k, "payments.booked")
	if strings.Join(values, " ") != "a/after" || ids["default/0/2"] != 1 || len(ids) != 1 {
		t.Errorf("published %v (identities %v), want only a/after, default/0/2, once", values, ids)
	}
	if dead := deadRows(t, pool); len(dead) != 1 || dead[0].id != "default/0/1" {
		t.Errorf("dead-letter rows %+v, want default/0/1 still", dead)
	}
	if n := outboxRows(t, pool); n != 0 {
		t.Errorf("%d rows left in the outbox table, want none", n)
	}
}

// A relay stopped after its transaction committed and before it deleted
// the rows the transaction published leaves them in the table, past the
// position. The relay that takes the partition over deletes them before
// it reports the partition (Relay.Pending), and publishes none of them
// again.
func TestRelayDeletesRowsLeftPastThePositionWhenItTakesOver(t *testing.T) {
	k, pool, _ := setup(t)
	addRows(t, pool, outbox.Writer{Partitions: 1}, "payments.booked", "a", []byte("a/0"), []byte("a/1"))
	o := outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0}, Logger: logger(),
		PollInterval: 20 * time.Millisecond}
	r, stop := runRelay(t, o)
	caughtUp(t, r, 2, "the two rows published")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Put the two published rows back, as a relay stopped before its
	// deletion leaves them.
	if _, err := pool.Exec(context.Background(), `INSERT INTO kscope_outbox (outbox, partition, seq, topic, key, value)
		VALUES ('default', 0, 1, 'payments.booked', 'a', 'a/0'), ('default', 0, 2, 'payments.booked', 'a', 'a/1')`); err != nil {
		t.Fatal(err)
	}
	r, stop = runRelay(t, o)
	caughtUp(t, r, 2, "the partition taken over at position 2")
	if n := outboxRows(t, pool); n != 0 {
		t.Errorf("%d rows left in the outbox table once the relay reports position 2, want none", n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	values, ids := valuesOf(t, k, "payments.booked")
	if strings.Join(values, " ") != "a/0 a/1" || ids["default/0/1"] != 1 || ids["default/0/2"] != 1 {
		t.Errorf("published %v (identities %v), want a/0 a/1, once each", values, ids)
	}
}
