package consumer_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/kscope-dev/kscope/consumer"
)

// A consumer run as a Kubernetes StatefulSet joins with the consumer group
// protocol (KIP-848, Kafka 4.3+) as a static member named after its pod
// (orders-0, orders-1, ...): a rolling deploy restarts each pod within
// the session timeout, and its partitions wait for it instead of moving.
func ExampleGroupProtocol() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pod, err := os.Hostname() // a StatefulSet pod's name survives its restarts
	if err != nil {
		log.Fatal(err)
	}
	r, err := consumer.New(consumer.Config{
		Brokers:       []string{"localhost:9092"},
		Group:         "orders",
		Topics:        []string{"orders.placed"},
		GroupProtocol: consumer.GroupProtocolConsumer,
		InstanceID:    pod,
		// The session timeout, which must exceed a pod's restart, is the
		// broker's group.consumer.session.timeout.ms under this protocol
		// (kgo.SessionTimeout in ClientOptions under the classic one).
	}, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
