package txn_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/txn"
)

// A Kafka-scope router sends each input to its topic's or header value's
// handler, whose outputs commit in the input's transaction; an input no
// route takes goes to the dead-letter topic, with no output.
func TestRouterInTheKafkaScope(t *testing.T) {
	k := setup(t)
	if err := k.CreateTopic(context.Background(), "payments", 2); err != nil {
		t.Fatal(err)
	}
	emit := func(route string) txn.Handler {
		return txn.HandlerFunc(func(_ context.Context, r *consumer.Record, out txn.Emitter) error {
			out.Emit(&kgo.Record{Topic: "out", Key: r.Key, Value: []byte(route + ":" + string(r.Value))})
			return nil
		})
	}
	router := txn.NewRouter().Topic("in", emit("in")).Header("payments", "event-type", "refund", emit("refunds"))
	cfg := config(k, "g-txn-route")
	cfg.Topics = []string{"in", "payments"}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "route-1"}, router)
	if err != nil {
		t.Fatal(err)
	}
	hdr := []kgo.RecordHeader{{Key: "event-type", Value: []byte("refund")}}
	if err := k.Produce(context.Background(), &kgo.Record{Topic: "in", Key: []byte("i1"), Value: []byte("i1")},
		&kgo.Record{Topic: "payments", Key: []byte("p1"), Value: []byte("p1"), Headers: hdr},
		&kgo.Record{Topic: "payments", Key: []byte("p2"), Value: []byte("p2")}); err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, time.Minute, "every input committed", func() bool { return r.Stats().Kafka.Records == 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var outs []string
	for _, o := range k.ReadAll(t, "out") {
		outs = append(outs, string(o.Value))
	}
	slices.Sort(outs)
	if want := []string{"in:i1", "refunds:p1"}; !slices.Equal(outs, want) {
		t.Errorf("outputs %v; want %v", outs, want)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic("g-txn-route"))
	if len(dlt) != 1 || string(dlt[0].Value) != "p2" || !strings.Contains(testenv.Header(dlt[0], retrytopic.HeaderError), "no route") {
		t.Errorf("dead letters %v; want p2 with a no-route error", dlt)
	}
}

// txn.New refuses a router that cannot route a topic of Config.Topics, and
// topic patterns, which the Kafka scope does not consume.
func TestRouterAndPatternsFailKafkaScopeConstruction(t *testing.T) {
	k := testenv.KafkaT(t)
	h := txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error { return nil })
	cfg := config(k, "g-txn-unrouted")
	cfg.Topics = []string{"in", "shipments"}
	_, err := txn.New(cfg, txn.Options{TransactionalID: "unrouted-1"}, txn.NewRouter().Topic("in", h))
	if err == nil || !strings.Contains(err.Error(), `kscope: Config.Topics: lists "shipments", which the handler (a txn.Router) has no route for`) {
		t.Errorf("txn.New = %v", err)
	}
	cfg.TopicPatterns = []string{`^events\.`}
	_, err = txn.New(cfg, txn.Options{TransactionalID: "patterns-1"}, txn.NewRouter().Default(h))
	if err == nil || !strings.Contains(err.Error(), "kscope: Config.TopicPatterns: is set for a scope that commits in Kafka transactions") {
		t.Errorf("txn.New with TopicPatterns = %v", err)
	}
}
