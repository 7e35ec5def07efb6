package txn_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

func dmsg(topic, key, id, value string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value), Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}}
}

// With Options.Dedupe, an input that repeats the message id of one that
// succeeded produces no output, in the same transaction or a later one,
// and after a restart (the remembered ids are restored from the
// changelog): each message's output is read_committed once.
func TestDedupeKafka(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const in, out, group = "ddk-in", "ddk-out", "g-ddk"
	for _, topic := range []string{in, out} {
		if err := k.CreateTopic(ctx, topic, 2); err != nil {
			t.Fatal(err)
		}
	}
	h := txn.HandlerFunc(func(_ context.Context, r *consumer.Record, em txn.Emitter) error {
		em.Emit(&kgo.Record{Topic: out, Key: r.Key, Value: r.Value})
		if string(r.Value) == "bad" {
			return consumer.Terminal(errors.New("rejected"))
		}
		return nil
	})
	start := func() (*txn.Runner, func() error) {
		cfg := consumer.Config{Brokers: k.Brokers, Group: group, Topics: []string{in}, CommitInterval: 50 * time.Millisecond, ClientOptions: clientOpts()}
		r, err := txn.New(cfg, txn.Options{TransactionalID: "ddk-1", Dedupe: &txn.DedupeOptions{}}, h)
		if err != nil {
			t.Fatal(err)
		}
		return r, runFor(t, r)
	}
	// The inputs of key e come in one poll, and so in one key-shard's
	// batch, whose keys the scope computes together before handling it:
	// each copy is matched with its own message id.
	if err := k.Produce(ctx, dmsg(in, "a", "m1", "m1"), dmsg(in, "b", "m2", "m2"), dmsg(in, "a", "m1", "m1"), dmsg(in, "c", "m3", "bad"),
		dmsg(in, "e", "e1", "e1"), dmsg(in, "e", "e2", "e2"), dmsg(in, "e", "e1", "e1"), dmsg(in, "e", "e3", "e3"), dmsg(in, "e", "e2", "e2")); err != nil {
		t.Fatal(err)
	}
	r, stop := start()
	testenv.WaitFor(t, time.Minute, "the first inputs committed", func() bool { return k.CaughtUp(ctx, group, in) })
	// The scope counts a transaction's records once it returns from its
	// commit, which the group's committed offsets can show first.
	testenv.WaitFor(t, time.Minute, "the first inputs counted", func() bool { return r.Stats().Kafka.Records == 9 })
	if st := r.Stats(); st.Kafka.Duplicates != 3 || st.Dedupe.Hits != 3 {
		t.Errorf("Stats.Kafka.Duplicates %d, Dedupe %+v; want 3 duplicates (m1, e1, e2)", st.Kafka.Duplicates, st.Dedupe)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// After a restart: m1 and m2 again are duplicates; m3 failed, so it
	// runs again (and succeeds now that its value is good).
	if err := k.Produce(ctx, dmsg(in, "b", "m2", "m2"), dmsg(in, "a", "m1", "m1"), dmsg(in, "c", "m3", "m3"), dmsg(in, "d", "m4", "m4")); err != nil {
		t.Fatal(err)
	}
	r, _ = start()
	testenv.WaitFor(t, time.Minute, "the later inputs committed", func() bool { return k.CaughtUp(ctx, group, in) })
	testenv.WaitFor(t, time.Minute, "the later inputs counted", func() bool { return r.Stats().Kafka.Records == 4 })
	if st := r.Stats(); st.Kafka.Duplicates != 2 {
		t.Errorf("Stats.Kafka.Duplicates %d after the restart; want 2 (m1, m2 restored from the changelog)", st.Kafka.Duplicates)
	}
	got := map[string]int{}
	for _, o := range k.ReadAll(t, out) {
		got[string(o.Value)]++
	}
	for _, v := range []string{"m1", "m2", "m3", "m4", "e1", "e2", "e3"} {
		if got[v] != 1 {
			t.Errorf("output %s read_committed %d times; want once (outputs %v)", v, got[v], got)
		}
	}
	if got["bad"] != 0 {
		t.Errorf("the failed input's output read_committed %d times; want none", got["bad"])
	}
}

// Dedupe with Versions, or with bad bounds, fails New with a sentence
// that says what to change.
func TestDedupeKafkaConfigErrors(t *testing.T) {
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}}
	h := txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error { return nil })
	for _, tc := range []struct {
		o     txn.Options
		field string
		says  string
	}{
		{txn.Options{TransactionalID: "x", Dedupe: &txn.DedupeOptions{}, Versions: &sequence.Config{}}, "Dedupe", "skip a duplicate as stale"},
		{txn.Options{TransactionalID: "x", Dedupe: &txn.DedupeOptions{Window: -time.Second}}, "Dedupe.Window", "positive duration"},
		{txn.Options{TransactionalID: "x", Dedupe: &txn.DedupeOptions{MaxIDs: -1}}, "Dedupe.MaxIDs", "positive count"},
		{txn.Options{TransactionalID: "x", Dedupe: &txn.DedupeOptions{MaxIDs: 1<<30 + 1}}, "Dedupe.MaxIDs", "at most 1073741824"},
	} {
		_, err := txn.New(cfg, tc.o, h)
		var ce *consumer.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("error %v; want field %s saying %q", err, tc.field, tc.says)
		}
	}
}
