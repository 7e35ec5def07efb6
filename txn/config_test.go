package txn_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/txn"
)

// Options that cannot work fail at construction, each naming its field and
// saying what to change; a bad consumer.Config is reported with them.
func TestBadOptionsFailAtConstruction(t *testing.T) {
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}}
	h := txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error { return nil })
	cases := []struct {
		name  string
		o     txn.Options
		field string
		says  string
	}{
		{"negative commit interval", txn.Options{CommitInterval: -time.Second}, "CommitInterval", "set a positive duration"},
		{"negative max records", txn.Options{MaxRecords: -1}, "MaxRecords", "set a positive count"},
		{"negative transaction timeout", txn.Options{TransactionTimeout: -time.Second}, "TransactionTimeout", "must be longer than CommitInterval"},
		{"timeout within the interval", txn.Options{CommitInterval: time.Minute, TransactionTimeout: 30 * time.Second}, "TransactionTimeout", "must be longer than CommitInterval"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := txn.New(cfg, tc.o, h)
			if err == nil {
				r.Close()
				t.Fatal("New accepted bad options")
			}
			var ce *consumer.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), "txn.Options."+tc.field) {
				t.Fatalf("error %q does not name txn.Options.%s", err, tc.field)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %q does not say %q", err, tc.says)
			}
		})
	}
	t.Run("config and options both wrong", func(t *testing.T) {
		_, err := txn.New(consumer.Config{Shards: -1}, txn.Options{MaxRecords: -1}, nil)
		for _, want := range []string{"Config.Brokers", "Config.Shards", "txn.Options.MaxRecords", "txn.New's handler: is nil"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("error %v does not name %s", err, want)
			}
		}
	})
}

// The Kafka scope has no share-group mode: a share group's
// acknowledgements are not part of Kafka transactions.
func TestShareGroupRefused(t *testing.T) {
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}, Share: &consumer.ShareConfig{}}
	h := txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error { return nil })
	_, err := txn.New(cfg, txn.Options{}, h)
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Share" || !strings.Contains(err.Error(), "not part of a transaction") {
		t.Fatalf("got %v, want Share refused with its reason", err)
	}
}
