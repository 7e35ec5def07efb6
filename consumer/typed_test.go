package consumer_test

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/kscope-dev/kscope/codec"
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/kscopeprom"
	"github.com/kscope-dev/kscope/retrytopic"
)

type payment struct {
	ID    string `avro:"id"`
	Cents int64  `avro:"cents"`
}

const paymentSchema = `{"type":"record","name":"Payment","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"cents","type":"long"}]}`

// Poison Avro records in the Confluent wire format (a wrong magic byte, a
// schema id the registry does not have, a truncated body) reach the
// dead-letter topic within a second of being produced, with their raw
// bytes and the decode headers, are counted as decode failures (in Stats
// and in kscope_decode_failures_total), and the good records of their
// partition behind them are handled, in order.
func TestTypedPoisonAvroToDLT(t *testing.T) {
	ctx := context.Background()
	reg := srfake.New()
	t.Cleanup(reg.Close)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := codec.RegistryAvro[payment](codec.Registry{Client: cl, AutoRegister: true}, paymentSchema)
	if err != nil {
		t.Fatal(err)
	}
	k := testenv.KafkaT(t)
	const topic, group = "payments-avro", "g-typed-poison"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	enc := func(id string) []byte {
		b, err := c.Encode(ctx, topic, payment{ID: id, Cents: 100})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	metrics, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var handled []string
	cfg := baseConfig(t, k, group, topic)
	cfg.Failures = fastFailures(retrytopic.Policy{})
	cfg.Hooks = append(cfg.Hooks, metrics)
	r, err := consumer.New(cfg, consumer.Typed(c, func(_ context.Context, _ *consumer.Record, p payment) error {
		mu.Lock()
		handled = append(handled, p.ID)
		mu.Unlock()
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	handledN := func() int { mu.Lock(); defer mu.Unlock(); return len(handled) }
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("a"), Value: enc("p-0")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the runner handling its first record", func() bool { return handledN() == 1 })

	good := enc("p-x")
	unknownID := []byte{0, 0, 0, 0x30, 0x39, 2, 'x'} // schema id 12345
	poison := map[string][]byte{
		"wrong-magic": append([]byte{1}, good[1:]...),
		"unknown-id":  unknownID,
		"truncated":   good[:7],
	}
	id, _, _ := sr.NewSerde().DecodeID(good)
	wantID := map[string]string{"wrong-magic": "", "unknown-id": "12345", "truncated": strconv.Itoa(id)}
	recs := []*kgo.Record{
		{Topic: topic, Key: []byte("a"), Value: poison["wrong-magic"], Headers: []kgo.RecordHeader{{Key: "case", Value: []byte("wrong-magic")}}},
		{Topic: topic, Key: []byte("a"), Value: enc("p-1")},
		{Topic: topic, Key: []byte("a"), Value: poison["unknown-id"], Headers: []kgo.RecordHeader{{Key: "case", Value: []byte("unknown-id")}}},
		{Topic: topic, Key: []byte("a"), Value: enc("p-2")},
		{Topic: topic, Key: []byte("a"), Value: poison["truncated"], Headers: []kgo.RecordHeader{{Key: "case", Value: []byte("truncated")}}},
		{Topic: topic, Key: []byte("a"), Value: enc("p-3")},
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Second, "three decode failures dead-lettered and the rest of the partition handled",
		func() bool { return r.Stats().Failures.DeadLettered == 3 && handledN() == 4 })

	mu.Lock()
	if !slices.Equal(handled, []string{"p-0", "p-1", "p-2", "p-3"}) {
		t.Errorf("handled %v, want p-0 to p-3 in order", handled)
	}
	mu.Unlock()
	if fs := r.Stats().Failures; fs.DecodeFailures != 3 || fs.Retries != 0 {
		t.Errorf("failure stats %+v: want 3 decode failures and no retry", fs)
	}
	if v := counterValue(t, metrics.Gatherer(), "kscope_decode_failures_total", map[string]string{"topic": topic, "format": "avro"}); v != 3 {
		t.Errorf("kscope_decode_failures_total{format=avro} = %v, want 3", v)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 3 {
		t.Fatalf("%d records on the DLT, want 3", len(dlt))
	}
	for _, d := range dlt {
		name := testenv.Header(d, "case")
		if !bytes.Equal(d.Value, poison[name]) {
			t.Errorf("%s: DLT value % x, want the raw bytes % x", name, d.Value, poison[name])
		}
		for h, want := range map[string]string{
			retrytopic.HeaderDecodeError:  "1",
			retrytopic.HeaderDecodeFormat: "avro",
			retrytopic.HeaderSchemaID:     wantID[name],
			retrytopic.HeaderErrorClass:   "terminal",
			retrytopic.HeaderAttempt:      "1",
		} {
			if got := testenv.Header(d, h); got != want {
				t.Errorf("%s: DLT header %s = %q, want %q", name, h, got, want)
			}
		}
	}
}

// counterValue sums the counters named name whose labels include want.
func counterValue(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			n := 0
			for _, lp := range m.GetLabel() {
				if v, ok := want[lp.GetName()]; ok && v == lp.GetValue() {
					n++
				}
			}
			if n == len(want) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
