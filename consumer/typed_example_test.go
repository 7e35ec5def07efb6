package consumer_test

import (
	"context"
	"log"

	"github.com/kscope-dev/kscope/codec"
	"github.com/kscope-dev/kscope/consumer"
)

// A typed handler: each record's value is decoded as a Shipment before the
// handler sees it. A value that is not a Shipment never reaches it: the
// record goes to the dead-letter topic at once with its raw bytes and the
// decode headers.
func ExampleTyped() {
	type Shipment struct {
		Order   string `json:"order"`
		Carrier string `json:"carrier"`
	}
	r, err := consumer.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "notifier",
		Topics:  []string{"shipments"},
	}, consumer.Typed(codec.JSON[Shipment](), func(ctx context.Context, r *consumer.Record, s Shipment) error {
		log.Printf("order %s shipped with %s", s.Order, s.Carrier)
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

// A handler that decodes by itself, here only the records with a
// header asking for it.
func ExampleDecodeValue() {
	type Audit struct{ Actor string }
	c := codec.JSON[Audit]()
	h := consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
		if t, _ := r.Header("type"); string(t) != "audit" {
			return nil
		}
		a, err := consumer.DecodeValue(ctx, c, r) // a DecodeError when it is not an Audit
		if err != nil {
			return err
		}
		log.Println("audited", a.Actor)
		return nil
	})
	_ = h
}
