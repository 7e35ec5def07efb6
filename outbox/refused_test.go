package outbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/outbox"
	"github.com/kscope-dev/kscope/retrytopic"
)

// addRows adds one record per value to the outbox w names, all with key,
// in one transaction, in order.
func addRows(t *testing.T, pool *pgxpool.Pool, w outbox.Writer, topic, key string, values ...[]byte) {
	t.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, v := range values {
			if _, err := w.Add(ctx, tx, &kgo.Record{Topic: topic, Key: []byte(key), Value: v,
				Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("text/plain")}}}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// valuesOf returns the values read_committed readers see on topic, in
// order, and how many times each record identity was published.
func valuesOf(t *testing.T, k *testenv.Kafka, topic string) (values []string, ids map[string]int) {
	t.Helper()
	ids = map[string]int{}
	for _, r := range k.ReadAll(t, topic) {
		values = append(values, string(r.Value))
		ids[testenv.Header(r, retrytopic.HeaderID)]++
	}
	return values, ids
}

// deadRow is a row of the dead-letter table.
type deadRow struct {
	id, topic, key, err string
	value               []byte
}

func deadRows(t *testing.T, pool *pgxpool.Pool) []deadRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT outbox || '/' || partition || '/' || seq, topic, key, value, error
		FROM kscope_outbox_dead ORDER BY outbox, partition, seq`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadRow, error) {
		var d deadRow
		var key []byte
		err := r.Scan(&d.id, &d.topic, &key, &d.value, &d.err)
		d.key = string(key)
		return d, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func outboxRows(t *testing.T, pool *pgxpool.Pool) (n int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM kscope_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// caughtUp waits until the relay's only partition is published up to seq.
func caughtUp(t *testing.T, r *outbox.Relay, seq int64, what string) {
	t.Helper()
	testenv.WaitFor(t, time.Minute, what, func() bool {
		st, err := r.Pending(context.Background())
		return err == nil && len(st) == 1 && st[0].Position == seq && st[0].Pending == 0
	})
}

// A row larger than the relay's producer takes (here its record batches
// are capped at 64 KiB; franz-go's default is about 1 MB) can never be
// published. It used to stop its outbox partition for good, retried in
// silence; now it is moved to the dead-letter table with the producer's
// error, and the rows before and after it are published once, in order.
func TestOversizedRowIsDeadLetteredBetweenHealthyRows(t *testing.T) {
	k, pool, _ := setup(t)
	big := bytes.Repeat([]byte("x"), 100<<10)
	addRows(t, pool, outbox.Writer{Partitions: 1}, "payments.booked", "a",
		[]byte("a/0"), []byte("a/1"), big, []byte("a/2"), []byte("a/3"))
	var logs testenv.LogBuffer
	r, stop := runRelay(t, outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0},
		Logger: logs.Logger(), PollInterval: 20 * time.Millisecond,
		ClientOptions: []kgo.Opt{kgo.ProducerBatchMaxBytes(64 << 10)}})
	caughtUp(t, r, 5, "the rows after the oversized one published")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, map[string][]string{"a": {"a/0", "a/1", "a/2", "a/3"}})
	if _, ids := published(t, k); ids["default/0/3"] != 0 || len(ids) != 4 {
		t.Errorf("published identities %v, want default/0/1, 2, 4 and 5", ids)
	}
	dead := deadRows(t, pool)
	if len(dead) != 1 {
		t.Fatalf("%d rows in the dead-letter table, want the oversized one: %+v", len(dead), dead)
	}
	d := dead[0]
	if d.id != "default/0/3" || d.topic != "payments.booked" || d.key != "a" || !bytes.Equal(d.value, big) {
		t.Errorf("dead-letter row %s to %s, key %q, %d bytes; want default/0/3 to payments.booked, key a, the %d bytes written",
			d.id, d.topic, d.key, len(d.value), len(big))
	}
	if !strings.Contains(d.err, kerr.MessageTooLarge.Message) {
		t.Errorf("dead-letter row's error %q does not say the record is too large", d.err)
	}
	if st := r.Stats(); st.DeadLettered != 1 || st.Published != 4 {
		t.Errorf("Stats %+v, want 1 dead-lettered and 4 published", st)
	}
	if n := outboxRows(t, pool); n != 0 {
		t.Errorf("%d rows left in the outbox table, want none", n)
	}
	if !hasLine(logs.String(), "level=ERROR", "default/0/3", "kscope_outbox_dead") {
		t.Errorf("the dead letter was not logged at ERROR with the row's identity and the table:\n%s", logs.String())
	}
}

// hasLine reports whether a line of logs holds every one of parts.
func hasLine(logs string, parts ...string) bool {
	for _, l := range strings.Split(logs, "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			return true
		}
	}
	return false
}

// A row whose topic name Kafka does not allow (written before Writer
// checked names, or by hand) can never be published either: it is
// dead-lettered, and the rows around it are published once, in order.
func TestRowToAnInvalidTopicIsDeadLettered(t *testing.T) {
	ctx := context.Background()
	k, pool, _ := setup(t)
	addRows(t, pool, outbox.Writer{Partitions: 1}, "payments.booked", "a", []byte("a/0"), []byte("misnamed"), []byte("a/1"))
	if _, err := pool.Exec(ctx, `UPDATE kscope_outbox SET topic = 'payments booked!' WHERE seq = 2`); err != nil {
		t.Fatal(err)
	}
	r, stop := runRelay(t, outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0},
		Logger: logger(), PollInterval: 20 * time.Millisecond})
	caughtUp(t, r, 3, "the row after the misnamed one published")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, map[string][]string{"a": {"a/0", "a/1"}})
	dead := deadRows(t, pool)
	if len(dead) != 1 || dead[0].id != "default/0/2" || dead[0].topic != "payments booked!" || string(dead[0].value) != "misnamed" || dead[0].err == "" {
		t.Fatalf("dead-letter table %+v, want the misnamed row default/0/2 with the broker's answer", dead)
	}
	if st := r.Stats(); st.DeadLettered != 1 || st.Stuck != 0 {
		t.Errorf("Stats %+v, want 1 dead-lettered and no partition stuck", st)
	}
}

// healthyRefusals counts the records of at most 1 KiB the broker refused
// as too large: healthy records that shared a batch with a large one.
type healthyRefusals struct{ n atomic.Int64 }

func (h *healthyRefusals) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	if errors.Is(err, kerr.MessageTooLarge) && len(r.Value) <= 1<<10 {
		h.n.Add(1)
	}
}

// The broker refuses a record batch larger than the topic's
// max.message.bytes with MESSAGE_TOO_LARGE for every record of the batch,
// and franz-go does not split batches: the refusal names no row. The relay
// publishes fewer rows per transaction until the row is refused alone, so
// the healthy rows that shared its batch are published, once and in order,
// and only the large row is dead-lettered.
func TestRefusedBatchDeadLettersOnlyTheRowRefusedAlone(t *testing.T) {
	ctx := context.Background()
	k, pool, _ := setup(t)
	const topic = "payments.capped"
	limit := "4096"
	resp, err := k.Admin().CreateTopic(ctx, 1, -1, map[string]*string{"max.message.bytes": &limit}, topic)
	if err == nil {
		err = resp.Err
	}
	if err == nil {
		err = k.WaitTopic(ctx, topic, 1)
	}
	if err != nil {
		t.Fatal(err)
	}
	var values [][]byte
	var want []string
	for i := range 12 {
		if i == 6 {
			// Random bytes: the producer compresses batches, and the
			// broker measures them compressed.
			large := make([]byte, 6000)
			rand.Read(large)
			values = append(values, large)
		}
		v := fmt.Sprintf("c/%d", i)
		values = append(values, []byte(v))
		want = append(want, v)
	}
	addRows(t, pool, outbox.Writer{Partitions: 1}, topic, "c", values...)
	var refused healthyRefusals
	r, stop := runRelay(t, outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0},
		Logger: logger(), PollInterval: 20 * time.Millisecond, ClientOptions: []kgo.Opt{kgo.WithHooks(&refused)}})
	caughtUp(t, r, 13, "the healthy rows published")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if refused.n.Load() == 0 {
		t.Fatal("no healthy record shared a refused batch with the large one: the refusal was never ambiguous")
	}
	got, ids := valuesOf(t, k, topic)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("published\n%v\nwant\n%v", got, want)
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("identity %q published %d times", id, n)
		}
	}
	dead := deadRows(t, pool)
	if len(dead) != 1 || dead[0].id != "default/0/7" || len(dead[0].value) != 6000 {
		t.Fatalf("dead-letter table %+v, want only the large row default/0/7", dead)
	}
	if !strings.Contains(dead[0].err, kerr.MessageTooLarge.Message) {
		t.Errorf("dead-letter row's error %q does not say the record is too large", dead[0].err)
	}
	if st := r.Stats(); st.DeadLettered != 1 || st.Published != 12 {
		t.Errorf("Stats %+v, want 1 dead-lettered and 12 published", st)
	}
}

// A row to a topic that does not exist (automatic creation is off) is not
// the row's fault: the relay publishes the rows before it, neither skips
// nor dead-letters it, says at ERROR which topic to create, and counts the
// partition stuck; once the topic exists every row is published once, in
// order.
func TestMissingTopicStopsThePartitionUntilCreated(t *testing.T) {
	ctx := context.Background()
	k, pool, _ := setup(t)
	const missing = "payments.refunded"
	w := outbox.Writer{Partitions: 1}
	addRows(t, pool, w, "payments.booked", "a", []byte("a/0"))
	addRows(t, pool, w, missing, "a", []byte("refund/0"))
	addRows(t, pool, w, "payments.booked", "a", []byte("a/1"))
	var logs testenv.LogBuffer
	r, stop := runRelay(t, outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0},
		Logger: logs.Logger(), PollInterval: 20 * time.Millisecond})
	testenv.WaitFor(t, time.Minute, "the missing topic reported at ERROR", func() bool {
		return hasLine(logs.String(), "level=ERROR", "topic="+missing, "create")
	})
	testenv.WaitFor(t, time.Minute, "the row before the refund published, and the partition counted stuck", func() bool {
		st, err := r.Pending(ctx)
		return err == nil && len(st) == 1 && st[0].Position == 1 && r.Stats().Stuck == 1
	})
	if st := r.Stats(); st.Published != 1 {
		t.Fatalf("Stats %+v while the topic is missing, want a/0 published and nothing after it", st)
	}
	if len(deadRows(t, pool)) != 0 {
		t.Fatal("a row to a missing topic was dead-lettered")
	}

	if err := k.CreateTopic(ctx, missing, 1); err != nil {
		t.Fatal(err)
	}
	caughtUp(t, r, 3, "every row published once the topic exists")
	testenv.WaitFor(t, 10*time.Second, "the partition no longer stuck", func() bool { return r.Stats().Stuck == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, k, map[string][]string{"a": {"a/0", "a/1"}})
	if got, ids := valuesOf(t, k, missing); len(got) != 1 || got[0] != "refund/0" || ids["default/0/2"] != 1 {
		t.Errorf("%s holds %v %v, want refund/0 once, as default/0/2", missing, got, ids)
	}
	if n := len(deadRows(t, pool)); n != 0 || r.Stats().DeadLettered != 0 {
		t.Errorf("%d rows dead-lettered (Stats %+v), want none", n, r.Stats())
	}
}

// A relay whose database lacks the dead-letter table (kscope upgraded,
// Migrate not run again) fails Run at once with a *dbscope.SchemaError
// that says to run Migrate, and so does one that meets a row to
// dead-letter after the table went; the row stays in the outbox and the
// position does not pass it.
func TestRelayWithoutTheDeadLetterTableSaysToRunMigrate(t *testing.T) {
	ctx := context.Background()
	// runFor runs r for at most a minute; timedOut says it did not return
	// by itself.
	runFor := func(r *outbox.Relay) (timedOut bool, err error) {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		err = r.Run(ctx)
		return ctx.Err() != nil, err
	}
	check := func(t *testing.T, timedOut bool, err error) {
		t.Helper()
		if timedOut {
			t.Fatal("the relay was still running a minute later")
		}
		var se *dbscope.SchemaError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "Migrate") || !strings.Contains(err.Error(), "kscope_outbox_dead") {
			t.Fatalf("Run returned %v, want a *dbscope.SchemaError naming kscope_outbox_dead and saying to run Migrate", err)
		}
	}
	t.Run("at start", func(t *testing.T) {
		k, pool, _ := setup(t)
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS kscope_outbox_dead`); err != nil {
			t.Fatal(err)
		}
		addRows(t, pool, outbox.Writer{Partitions: 1}, "payments.booked", "a", []byte("a/0"))
		r, err := outbox.New(outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0},
			Logger: logger(), PollInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		timedOut, err := runFor(r)
		check(t, timedOut, err)
		if n := outboxRows(t, pool); n != 1 {
			t.Errorf("%d rows in the outbox, want the one written", n)
		}
	})
	t.Run("while running", func(t *testing.T) {
		k, pool, _ := setup(t)
		w := outbox.Writer{Partitions: 1}
		addRows(t, pool, w, "payments.booked", "a", []byte("a/0"))
		r, err := outbox.New(outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 1, OwnPartitions: []int{0},
			Logger: logger(), PollInterval: 20 * time.Millisecond, ClientOptions: []kgo.Opt{kgo.ProducerBatchMaxBytes(64 << 10)}})
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			err      error
			timedOut bool
		}
		done := make(chan result, 1)
		go func() {
			timedOut, err := runFor(r)
			done <- result{err, timedOut}
		}()
		testenv.WaitFor(t, 30*time.Second, "the first row published", func() bool { return r.Stats().Published == 1 })
		if _, err := pool.Exec(ctx, `DROP TABLE kscope_outbox_dead`); err != nil {
			t.Fatal(err)
		}
		addRows(t, pool, w, "payments.booked", "a", bytes.Repeat([]byte("x"), 100<<10), []byte("a/1"))
		res := <-done
		check(t, res.timedOut, res.err)
		if n := outboxRows(t, pool); n != 2 {
			t.Errorf("%d rows in the outbox, want the oversized row and the one after it", n)
		}
		checkExactlyOnce(t, k, map[string][]string{"a": {"a/0"}})
	})
}
