// Command enrich is the Kafka-scope example: orders in, enriched orders
// out, exactly once within Kafka. Each output and its input's offset commit
// in one transaction; the outputs are read back with read_committed, as
// every consumer of them must.
//
//	go run ./examples/enrich
//	KAFKA_BROKERS=localhost:9092 go run ./examples/enrich
//
// Its topics, group and transactional id end in a suffix of their own per
// run (devenv.RunName), and it removes them when it ends, so that it runs
// again and again against the same broker; a service uses fixed names.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/devenv"
	"github.com/kscope-dev/kscope/txn"
)

// The pipeline's topics and group.
var (
	ordersTopic   = devenv.RunName("orders")
	enrichedTopic = devenv.RunName("orders.enriched")
	group         = devenv.RunName("enricher")
)

const orders = 500

// Order is an incoming order; Enriched is what the pipeline emits.
type Order struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

// Enriched is an order with what the pipeline adds.
type Enriched struct {
	Order
	Tier string `json:"tier"`
}

// Enrich is the pipeline's handler: decode, classify, emit.
func Enrich(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
	var o Order
	if err := json.Unmarshal(r.Value, &o); err != nil {
		return consumer.DecodeError(err) // poison: dead-lettered inside the transaction
	}
	tier := "standard"
	if o.Cents >= 50_000 {
		tier = "gold"
	}
	body, _ := json.Marshal(Enriched{Order: o, Tier: tier})
	out.Emit(&kgo.Record{Topic: enrichedTopic, Key: r.Key, Value: body})
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "enrich:", err)
		os.Exit(1)
	}
}

// run is the example: it produces the orders, runs the pipeline until
// every order is done, and reads the outputs back.
func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kafka, err := devenv.StartKafka(ctx)
	if err != nil {
		return err
	}
	defer kafka.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.Brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopics(ctx, 3, -1, nil, ordersTopic, enrichedTopic); err != nil {
		return err
	}
	// Remove what this run created: its topics, the dead-letter topic kscope
	// creates for the group, and the group.
	defer kafka.Remove(context.WithoutCancel(ctx), group, ordersTopic, enrichedTopic) //nolint:errcheck // best effort
	if err := produceOrders(ctx, cl); err != nil {
		return err
	}
	st, err := enrichAll(ctx, kafka.Brokers)
	if err != nil {
		return err
	}
	seen, gold, err := readEnriched(ctx, kafka.Brokers)
	if err != nil {
		return err
	}
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	fmt.Printf("%d orders enriched in %d transactions; read_committed sees %d outputs (%d gold), %d duplicates\n",
		st.Kafka.Records, st.Kafka.Committed, len(seen), gold, dups)
	if len(seen) != orders || dups != 0 {
		return fmt.Errorf("expected each of %d orders exactly once", orders)
	}
	return nil
}

// produceOrders writes the incoming orders, keyed by customer.
func produceOrders(ctx context.Context, cl *kgo.Client) error {
	var recs []*kgo.Record
	for i := 0; i < orders; i++ {
		o := Order{ID: fmt.Sprintf("o-%04d", i), Customer: fmt.Sprintf("c-%02d", i%23), Cents: int64(i * 173 % 90_000)}
		body, _ := json.Marshal(o)
		recs = append(recs, &kgo.Record{Topic: ordersTopic, Key: []byte(o.Customer), Value: body})
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// enrichAll runs the Kafka-scope pipeline until every order is done (or a
// minute passes), stops it, and returns its stats.
func enrichAll(ctx context.Context, brokers []string) (consumer.Stats, error) {
	r, err := txn.New(consumer.Config{
		Brokers: brokers,
		Group:   group,
		Topics:  []string{ordersTopic},
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}, txn.Options{TransactionalID: group + "-1"}, txn.HandlerFunc(Enrich))
	if err != nil {
		return consumer.Stats{}, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	deadline := time.Now().Add(time.Minute)
	for r.Stats().Kafka.Records < orders && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		return consumer.Stats{}, err
	}
	return r.Stats(), nil
}

// readEnriched reads the outputs back as any downstream consumer must,
// read_committed, and counts them per order and the gold ones.
func readEnriched(ctx context.Context, brokers []string) (seen map[string]int, gold int, err error) {
	rd, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(enrichedTopic), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return nil, 0, err
	}
	defer rd.Close()
	seen = map[string]int{}
	readCtx, cancelRead := context.WithTimeout(ctx, 30*time.Second)
	defer cancelRead()
	for len(seen) < orders && readCtx.Err() == nil {
		rd.PollFetches(readCtx).EachRecord(func(rec *kgo.Record) {
			var e Enriched
			json.Unmarshal(rec.Value, &e)
			seen[e.ID]++
			if e.Tier == "gold" {
				gold++
			}
		})
	}
	return seen, gold, nil
}
