package txn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/txn"
)

// In the Kafka scope, the dead letter its transaction writes carries the
// group's owner (consumer.Config.Owner) in its kscope-owner header.
func TestKafkaScopeDeadLetterCarriesTheOwner(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const in, group, owner = "txn-owned", "g-txn-owned", "payments <#payments-oncall>"
	if err := k.CreateTopic(ctx, in, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, dmsg(in, "a", "order-1", "poison")); err != nil {
		t.Fatal(err)
	}
	r, err := txn.New(consumer.Config{Brokers: k.Brokers, Group: group, Topics: []string{in}, Owner: owner, CommitInterval: 50 * time.Millisecond, ClientOptions: clientOpts()},
		txn.Options{TransactionalID: "txn-owned"},
		txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error {
			return consumer.Terminal(errors.New("rejected"))
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	testenv.WaitFor(t, time.Minute, "the input committed", func() bool { return k.CaughtUp(ctx, group, in) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || testenv.Header(dlt[0], retrytopic.HeaderOwner) != owner {
		t.Fatalf("DLT %v: want one record with owner %q", dlt, owner)
	}
}
