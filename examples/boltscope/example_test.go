package boltscope_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/examples/boltscope"
)

// payment is the input: an amount to add to an account.
type payment struct {
	Account string
	Cents   int64
}

// applyPayment appends a payment to the ledger and adds it to its
// account's balance, in tx: an effect that applying the record twice
// would show.
func applyPayment(_ context.Context, tx *bolt.Tx, r *consumer.Record) error {
	var p payment
	if err := json.Unmarshal(r.Value, &p); err != nil {
		return consumer.DecodeError(err)
	}
	if p.Account == "" {
		return consumer.DecodeError(fmt.Errorf("payment %s names no account", r.Value))
	}
	ledger, err := tx.CreateBucketIfNotExists([]byte("ledger"))
	if err != nil {
		return err
	}
	seq, err := ledger.NextSequence()
	if err != nil {
		return err
	}
	if err := ledger.Put(binary.BigEndian.AppendUint64(nil, seq), r.Value); err != nil {
		return err
	}
	balances, err := tx.CreateBucketIfNotExists([]byte("balances"))
	if err != nil {
		return err
	}
	var balance int64
	if b := balances.Get([]byte(p.Account)); b != nil {
		balance = int64(binary.BigEndian.Uint64(b))
	}
	return balances.Put([]byte(p.Account), binary.BigEndian.AppendUint64(nil, uint64(balance+p.Cents)))
}

// A service whose state is a bbolt file: each payment is applied to the
// ledger once, in the transaction that also records it in the inbox, and
// its offset is committed after that transaction.
func Example() {
	db, err := bolt.Open("ledger.db", 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		log.Fatal(err) // bolt.ErrTimeout: another process has the file open
	}
	defer db.Close()
	r, err := boltscope.New(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "ledger",
		Topics:  []string{"payments"},
	}, db, boltscope.HandlerFunc(applyPayment))
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
