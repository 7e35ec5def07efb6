package txn_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/codec"
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/txn"
)

type item struct {
	SKU string `avro:"sku"`
	Qty int    `avro:"qty"`
}

// A typed Kafka-scope handler emits its outputs through a codec; an input
// that does not decode is dead-lettered in the transaction, raw, with the
// decode headers, and counted as a decode failure.
func TestTypedHandlerEmitsAndDeadLettersUndecodable(t *testing.T) {
	ctx := context.Background()
	k := setup(t)
	c, err := codec.Avro[item](`{"type":"record","name":"Item","fields":[{"name":"sku","type":"string"},{"name":"qty","type":"int"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	out := codec.JSON[item]()
	var recs []*kgo.Record
	for i := range 5 {
		b, err := c.Encode(ctx, "in", item{SKU: "sku-" + strconv.Itoa(i), Qty: i})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: "in", Key: []byte("k"), Value: b})
	}
	poison := []byte{0x06, 's'} // a 3-byte string announced, 1 given
	recs = append(recs, &kgo.Record{Topic: "in", Key: []byte("k"), Value: poison})
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	r, err := txn.New(config(k, "g-typed"), txn.Options{TransactionalID: "typed-1"}, txn.Typed(c,
		func(ctx context.Context, rec *consumer.Record, v item, em txn.Emitter) error {
			v.Qty *= 10
			return txn.EmitValue(ctx, em, out, "out", rec.Key, v)
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, time.Minute, "every input committed", func() bool { return r.Stats().Kafka.Records == 6 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	outs := k.ReadAll(t, "out")
	if len(outs) != 5 {
		t.Fatalf("%d outputs, want 5", len(outs))
	}
	for _, o := range outs {
		v, err := out.Decode(ctx, "out", o.Value)
		if err != nil || v.Qty%10 != 0 {
			t.Fatalf("output %q: %+v, %v", o.Value, v, err)
		}
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic("g-typed"))
	if len(dlt) != 1 || string(dlt[0].Value) != string(poison) {
		t.Fatalf("DLT %v, want the undecodable input, raw", dlt)
	}
	if got := testenv.Header(dlt[0], retrytopic.HeaderDecodeFormat); got != "avro" || testenv.Header(dlt[0], retrytopic.HeaderDecodeError) != "1" {
		t.Fatalf("DLT decode headers: format %q", got)
	}
	if st := r.Stats(); st.Failures.DecodeFailures != 1 || st.Kafka.DeadLettered != 1 {
		t.Fatalf("stats %+v: want 1 decode failure dead-lettered", st)
	}
}
