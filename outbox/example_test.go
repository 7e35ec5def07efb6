package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/outbox"
)

// A service debits an account and tells others in the same transaction:
// the relay publishes the event if and only if the transaction commits,
// exactly once to a read_committed reader.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://localhost/payments")
	if err != nil {
		log.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool, ""); err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - 100 WHERE id = 'acct-1'`); err != nil {
			return err
		}
		_, err := outbox.Add(ctx, tx, &kgo.Record{Topic: "payment.booked", Key: []byte("acct-1"), Value: []byte(`{"debited":100}`)})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// The relay, here or in a process of its own: instances share the
	// outbox's partitions through a consumer group.
	relay, err := outbox.New(outbox.Options{Brokers: []string{"localhost:9092"}, Pool: pool})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil { // nil once ctx ends
		log.Fatal(err)
	}
}

// A DB-scope handler that queues its statements queues the outbox insert
// with them: the event is published if and only if the record's
// transaction, with its inbox row, commits.
func ExampleWriter_Queue() {
	w := outbox.Writer{} // the relay's Outbox, Partitions and TablePrefix: here the defaults
	handler := dbscope.QueueFunc(func(ctx context.Context, q *dbscope.Queue, rec *consumer.Record) error {
		q.Exec(`INSERT INTO bookings (payment, body) VALUES ($1, $2)`, rec.Key, rec.Value)
		return w.Queue(q, &kgo.Record{Topic: "payment.booked", Key: rec.Key, Value: rec.Value})
	})
	_ = handler
}

// The rows Kafka refuses for good wait in the dead-letter table: list
// them, and requeue one once Kafka takes it (the relay publishes it again
// with its identity), or discard it.
func ExampleDeadLetters() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/payments")
	if err != nil {
		log.Fatal(err)
	}
	dead := outbox.DeadLetters{DB: pool}
	rows, err := dead.List(ctx, outbox.DefaultOutbox)
	if err != nil {
		log.Fatal(err)
	}
	for _, row := range rows {
		fmt.Printf("%s to %s, %d bytes: %s\n", row.ID, row.Topic, row.Size, row.Error)
		if _, err := dead.Requeue(ctx, row.ID, ""); err != nil { // "" keeps the row's topic
			log.Print(err)
		}
	}
}

// Writer refuses a record to a topic Kafka does not allow, in the writing
// transaction, rather than leave the relay a row it must dead-letter.
func ExampleValidTopic() {
	fmt.Println(outbox.ValidTopic("payment.booked"), outbox.ValidTopic("payment booked"), outbox.ValidTopic(".."))
	// Output: true false false
}
