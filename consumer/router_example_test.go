package consumer_test

import (
	"context"
	"fmt"
	"log"

	"github.com/kscope-dev/kscope/consumer"
)

// One runner consumes three topics: orders go to one handler, refunds (an
// event type on the payments topic) to another, every other payment to a
// third, and the topics of every region's audit log, including those
// created later, to a fourth.
func ExampleRouter() {
	handler := func(name string) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
			fmt.Printf("%s: %s\n", name, rec.Value)
			return nil
		})
	}
	router := consumer.NewRouter().
		Topic("orders", handler("orders")).
		Header("payments", "event-type", "refund", handler("refunds")).
		Topic("payments", handler("payments")).
		Pattern(`^audit\.`, handler("audit"))
	r, err := consumer.New(consumer.Config{
		Brokers:       []string{"localhost:9092"},
		Group:         "billing",
		Topics:        []string{"orders", "payments"},
		TopicPatterns: []string{`^audit\.`},
	}, router)
	if err != nil {
		log.Fatal(err)
	}
	_ = r // r.Run(ctx)
}

// A topic the router cannot route fails construction with a sentence that
// names it and says what to add.
func ExampleRouter_unroutedTopic() {
	h := consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil })
	_, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "billing",
		Topics:  []string{"orders", "shipments"},
	}, consumer.NewRouter().Topic("orders", h))
	fmt.Println(err)
	// Output:
	// kscope: Config.Topics: lists "shipments", which the handler (a consumer.Router) has no route for, and the router has no default; add a route for it (Topic("shipments", handler) or a Pattern that matches it), or a Default
}
