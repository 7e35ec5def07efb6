package txn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/txn"
)

// Whatever Options hold, New never panics: it returns a ConfigError naming
// a field, or accepts options within their documented bounds.
func FuzzOptions(f *testing.F) {
	f.Add("", int64(0), 0, int64(0))
	f.Add("enricher-0", int64(time.Second), 10, int64(time.Minute))
	f.Add("x", int64(-1), -1, int64(-1))
	f.Add("x", int64(time.Minute), 1, int64(time.Second))
	cfg := consumer.Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}}
	h := txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error { return nil })
	f.Fuzz(func(t *testing.T, id string, commit int64, maxRecords int, timeout int64) {
		o := txn.Options{TransactionalID: id, CommitInterval: time.Duration(commit), MaxRecords: maxRecords, TransactionTimeout: time.Duration(timeout)}
		r, err := txn.New(cfg, o, h)
		if err != nil {
			var ce *consumer.ConfigError
			if !errors.As(err, &ce) || ce.Field == "" || ce.Reason == "" {
				t.Fatalf("error %q is not a ConfigError naming a field", err)
			}
			return
		}
		r.Close()
		if commit < 0 || maxRecords < 0 || timeout < 0 || (timeout > 0 && timeout <= max(commit, 0)) {
			t.Fatalf("New accepted %+v", o)
		}
	})
}
