package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/codec"
	"github.com/kscope-dev/kscope/retrytopic"
)

// workload is what a run produces: orders over customers (the key), an
// event per order (shipped, or every fifth cancelled), and among them
// three poison orders and one unrouted event per ten orders.
type workload struct{ orders, customers int }

// expected is what the consumers must end with.
type expected struct{ orders, events, poison, unrouted int }

// produce writes the workload and returns what the consumers must do.
func (w workload) produce(ctx context.Context, e *env, orders codec.Codec[Order]) (expected, error) {
	var recs []*kgo.Record
	var want expected
	for i := range w.orders {
		customer := fmt.Sprintf("customer-%d", i%w.customers)
		o := Order{ID: fmt.Sprintf("order-%d", i), Customer: customer, Cents: int64(100 + i)}
		r, err := codec.NewRecord(ctx, orders, e.names.placed, []byte(customer), o)
		if err != nil {
			return want, err
		}
		recs = append(recs, r, w.update(e, i, customer))
		want.orders, want.events = want.orders+1, want.events+1
		if i%10 == 9 {
			recs = append(recs, &kgo.Record{Topic: e.names.updates, Key: []byte(customer), Value: []byte(`{"order":"` + o.ID + `"}`),
				Headers: []kgo.RecordHeader{{Key: "event-type", Value: []byte("refunded")}}})
			want.unrouted++
		}
	}
	// Poison: a wrong magic byte, a schema id the registry does not have,
	// a truncated body.
	good := recs[0].Value
	for _, v := range [][]byte{append([]byte{1}, good[1:]...), {0, 0, 0, 0x7f, 0x7f, 2, 'x'}, good[:len(good)-3]} {
		recs = append(recs, &kgo.Record{Topic: e.names.placed, Key: []byte("customer-0"), Value: v})
		want.poison++
	}
	return want, e.cl.ProduceSync(ctx, recs...).FirstErr()
}

// update is order i's event: shipped, or every fifth cancelled.
func (w workload) update(e *env, i int, customer string) *kgo.Record {
	order := fmt.Sprintf("order-%d", i)
	typ, v := "shipped", any(Shipped{Order: order, Carrier: "parcel-co"})
	if i%5 == 4 {
		typ, v = "cancelled", Cancelled{Order: order, Reason: "customer asked"}
	}
	b, _ := json.Marshal(v)
	return &kgo.Record{Topic: e.names.updates, Key: []byte(customer), Value: b,
		Headers: []kgo.RecordHeader{{Key: "event-type", Value: []byte(typ)}}}
}

// check reads the tables and the dead-letter topics back.
func check(ctx context.Context, e *env, want expected) (report, error) {
	rep := report{Kafka: e.kafka.Kind, Postgres: e.pgKind}
	var distinctOrders, distinctEvents int
	if err := e.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM orders`).Scan(&rep.Orders, &distinctOrders); err != nil {
		return rep, err
	}
	if err := e.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (order_id, event)) FROM order_events`).Scan(&rep.Events, &distinctEvents); err != nil {
		return rep, err
	}
	rep.Duplicates = rep.Orders - distinctOrders + rep.Events - distinctEvents
	rep.Lost = max(0, want.orders-distinctOrders) + max(0, want.events-distinctEvents)
	dead, err := deadLetters(ctx, e, want.poison+want.unrouted)
	if err != nil {
		return rep, err
	}
	for _, r := range dead {
		if r.Topic == dltName(e.names.ordersGroup) {
			rep.OrdersDLT++
		} else {
			rep.UpdatesDLT++
		}
		if hasHeader(r, retrytopic.HeaderDecodeError) {
			rep.DecodeHeaders++
		}
	}
	rep.OK = rep.Duplicates == 0 && rep.Lost == 0 && rep.Orders == want.orders && rep.Events == want.events &&
		rep.OrdersDLT == want.poison && rep.UpdatesDLT == want.unrouted && rep.DecodeHeaders == want.poison
	return rep, nil
}

// deadLetters reads the two dead-letter topics until n records came, or
// for a few seconds.
func deadLetters(ctx context.Context, e *env, n int) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers...),
		kgo.ConsumeTopics(dltName(e.names.ordersGroup), dltName(e.names.updatesGroup)),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out, nil
}

func hasHeader(r *kgo.Record, key string) bool {
	for _, h := range r.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}
