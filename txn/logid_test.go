package txn_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// The Kafka scope's dead-letter line names the record by its identity
// ("id", here its message-id header) and says why it was dead-lettered.
func TestKafkaScopeLogLinesCarryTheRecordsID(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const in, group = "txn-log-id", "g-txn-log-id"
	if err := k.CreateTopic(ctx, in, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, dmsg(in, "a", "order-9", "poison")); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	r, err := txn.New(consumer.Config{Brokers: k.Brokers, Group: group, Topics: []string{in}, CommitInterval: 50 * time.Millisecond, ClientOptions: clientOpts(),
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))},
		txn.Options{TransactionalID: "txn-log-id"},
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
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		if msg, _ := line["msg"].(string); strings.Contains(msg, "sent to the dead-letter topic") {
			if line["id"] != "order-9" || line["reason"] != hook.ReasonTerminalFailure {
				t.Errorf("dead-letter line %s: want id order-9 and reason %s", sc.Text(), hook.ReasonTerminalFailure)
			}
			return
		}
	}
	t.Errorf("no dead-letter line logged:\n%s", logs.String())
}
