package txn_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// A handler panic whose record goes to the dead-letter topic at once (no
// retry in place) has its stack logged, once, in the Kafka scope's own
// dead-letter line; the error carries the panic's value alone.
func TestPanicStackInTheDeadLetterLine(t *testing.T) {
	k := setup(t)
	var logs testenv.LogBuffer
	cfg := config(k, "panics")
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	cfg.Failures.UnknownAttempts = 1
	r, err := txn.New(cfg, txn.Options{TransactionalID: "panics"}, txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error {
		panic("boom")
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, r)
	if err := k.Produce(context.Background(), &kgo.Record{Topic: "in", Key: []byte("a"), Value: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the record dead-lettered", func() bool { return r.Stats().Kafka.DeadLettered == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, raw := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var l struct{ Msg, Err, Stack string }
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Fatalf("log line %q: %v", raw, err)
		}
		if !strings.Contains(l.Msg, "dead-letter topic (in the transaction)") {
			continue
		}
		found = true
		if l.Err != "kscope: handler panicked: boom" || !strings.Contains(l.Stack, "goroutine") {
			t.Errorf("dead-letter line: err %q, stack %q; want the value alone, and the stack", l.Err, l.Stack)
		}
	}
	if !found {
		t.Fatalf("no dead-letter line:\n%s", logs.String())
	}
}
