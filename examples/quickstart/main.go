// Command quickstart consumes a topic with kscope's AtLeastOnce runner and
// prints each record. It writes a few keyed records to a topic of its own,
// stops once all of them are handled and committed, and removes its topic
// and group. With no KAFKA_BROKERS it starts an in-process Kafka (kfake):
//
//	go run ./examples/quickstart
//	KAFKA_BROKERS=localhost:9092 go run ./examples/quickstart
//
// Its topic and group names end in a suffix of their own per run
// (devenv.RunName), so that it runs again and again against the same
// broker; a service uses fixed names.
//
// With -topic it runs as a service does: it consumes that topic as group
// -group (produces, creates and removes nothing) until Ctrl-C or SIGTERM,
// then drains the running records, commits their offsets and exits 0:
//
//	KAFKA_BROKERS=localhost:9092 go run ./examples/quickstart -topic orders -group quickstart
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/devenv"
)

const keys, perKey = 5, 4

func main() {
	topic := flag.String("topic", "", "consume this topic as a service does, until Ctrl-C or SIGTERM (produce, create and remove nothing)")
	group := flag.String("group", "quickstart", "the consumer group, with -topic")
	flag.Parse()
	// Ctrl-C sends SIGINT, Kubernetes stops a pod with SIGTERM: both cancel
	// ctx, and Run drains, commits and returns.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if *topic != "" {
		err = serve(ctx, *topic, *group)
	} else {
		err = run(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// newRunner is the consumer: an AtLeastOnce runner that prints each record.
func newRunner(brokers []string, group, topic string, handled *atomic.Int64) (*consumer.Runner, error) {
	return consumer.New(consumer.Config{
		Brokers: brokers,
		Group:   group,
		Topics:  []string{topic},
		Shards:  4,
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}, consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
		fmt.Printf("partition %d offset %3d key %s value %s\n", r.Partition, r.Offset, r.Key, r.Value)
		handled.Add(1)
		return nil
	}))
}

// serve consumes topic as group until ctx ends (Ctrl-C or SIGTERM); Run
// then lets the running records finish, commits their offsets and returns
// nil.
func serve(ctx context.Context, topic, group string) error {
	kafka, err := devenv.StartKafka(ctx)
	if err != nil {
		return err
	}
	defer kafka.Close()
	var handled atomic.Int64
	runner, err := newRunner(kafka.Brokers, group, topic, &handled)
	if err != nil {
		return err
	}
	if err := runner.Run(ctx); err != nil {
		return err
	}
	fmt.Printf("stopped: handled %d records, committed their offsets\n", handled.Load())
	return nil
}

// run is the self-contained run: produce, consume until every record is
// handled (or a signal), check the committed offsets, remove what it made.
func run(ctx context.Context) error {
	kafka, err := devenv.StartKafka(ctx)
	if err != nil {
		return err
	}
	defer kafka.Close()
	topic, group := devenv.RunName("quickstart.orders"), devenv.RunName("quickstart")
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.Brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 3, -1, nil, topic); err != nil {
		return fmt.Errorf("creating %s: %w", topic, err)
	}
	// Remove what this run created: its topic, the dead-letter topic kscope
	// creates for the group, and the group.
	defer kafka.Remove(context.WithoutCancel(ctx), group, topic) //nolint:errcheck // best effort
	var recs []*kgo.Record
	for k := range keys {
		for i := range perKey {
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", k)), Value: []byte(fmt.Sprintf("order %d of k%d", i, k))})
		}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return err
	}
	fmt.Printf("kafka: %s (%s); produced %d records to %s\n", kafka.Kind, kafka.Brokers[0], len(recs), topic)

	var handled atomic.Int64
	runner, err := newRunner(kafka.Brokers, group, topic, &handled)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()

	// Wait until every record is handled; stopping commits their offsets.
	deadline := time.Now().Add(time.Minute)
	for handled.Load() < int64(len(recs)) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		return err
	}
	offsets, err := adm.FetchOffsetsForTopics(context.WithoutCancel(ctx), group, topic)
	if err != nil {
		return err
	}
	committed, sum := map[int32]int64{}, int64(0)
	offsets.Each(func(o kadm.OffsetResponse) { committed[o.Partition], sum = o.At, sum+max(o.At, 0) })
	fmt.Printf("handled %d records; committed offsets %v\n", handled.Load(), committed)
	if ctx.Err() != nil {
		return nil // stopped by a signal: what was handled is committed
	}
	if handled.Load() < int64(len(recs)) || sum != int64(len(recs)) {
		return fmt.Errorf("handled %d of %d records, committed %d", handled.Load(), len(recs), sum)
	}
	return nil
}
