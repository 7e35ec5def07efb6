package txn_test

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// A Kafka-scope runner whose TLS setup the brokers refuse stops at start
// with consumer.ErrBrokerSetup, as the other scopes do.
func TestTLSAgainstPlaintextBrokerIsBrokerSetupError(t *testing.T) {
	k := testenv.KafkaT(t)
	if err := k.CreateTopic(context.Background(), "in", 1); err != nil {
		t.Fatal(err)
	}
	cfg := config(k, "g-tls-mismatch")
	cfg.ClientOptions = []kgo.Opt{kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12})}
	r, err := txn.New(cfg, txn.Options{TransactionalID: "tls-1"}, enrich)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if ctx.Err() != nil || !errors.Is(err, consumer.ErrBrokerSetup) {
		t.Fatalf("Run returned %v, want consumer.ErrBrokerSetup before its deadline", err)
	}
}
