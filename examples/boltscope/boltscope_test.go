package boltscope_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/examples/boltscope"
	"github.com/kscope-dev/kscope/kscopetest"
)

func TestMain(m *testing.M) { kscopetest.Main(m) }

// ledgerPipeline is the ledger service on the bbolt scope, as the kit runs
// it: a fresh file per scenario, the handler's work run through the kit's
// faults, the ledger's entries as its effects. Each runner the kit builds
// is sent to runners, when not nil.
func ledgerPipeline(runners chan<- *consumer.Runner) kscopetest.ScopePipeline[*bolt.DB] {
	return kscopetest.ScopePipeline[*bolt.DB]{
		Open: func(t *testing.T) *bolt.DB { return openFile(t) },
		Runner: func(db *bolt.DB, cfg consumer.Config, f *kscopetest.Faults) (*consumer.Runner, error) {
			r, err := boltscope.New(cfg, db, boltscope.HandlerFunc(func(ctx context.Context, tx *bolt.Tx, r *consumer.Record) error {
				return f.Call(r, func() error { return applyPayment(ctx, tx, r) })
			}))
			if err == nil && runners != nil {
				runners <- r
			}
			return r, err
		},
		Valid: func(i int) *kgo.Record {
			return &kgo.Record{Value: fmt.Appendf(nil, `{"Account":"acct-%d","Cents":%d}`, i%3, 100+i)}
		},
		Undecodable: func() *kgo.Record { return &kgo.Record{Value: []byte("not json")} },
		Effects: func(_ context.Context, db *bolt.DB) (n int, err error) {
			err = db.View(func(tx *bolt.Tx) error {
				if b := tx.Bucket([]byte("ledger")); b != nil {
					n = b.Stats().KeyN
				}
				return nil
			})
			return n, err
		},
	}
}

func openFile(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return db
}

// checkReport fails t unless every scenario of rep ran and held, with no
// record handled again.
func checkReport(t *testing.T, rep kscopetest.Report) {
	t.Helper()
	if len(rep) == 0 {
		t.Fatal("the kit ran no scenario")
	}
	for _, r := range rep {
		if !r.Held || r.Skipped || len(r.Repeats) > 0 {
			t.Errorf("%s: held %v, skipped %v, repeats %v: %s", r.Scenario, r.Held, r.Skipped, r.Repeats, r.Detail)
		}
	}
}

// The scope passes the kit's delivery-semantics table: each payment is in
// the ledger once across duplicates, a crash before the offset commit and
// a replay, and failures are retried in place or dead-lettered with no
// effect.
func TestKitTable(t *testing.T) {
	checkReport(t, kscopetest.Scope(t, ledgerPipeline(nil)))
}

// Unordered, with one attempt in place per hop, a failing record moves
// through the delayed retry topics: the table still holds (a record that
// succeeds on a later hop is in the ledger once), and the retry topics
// were used.
func TestKitTableUnordered(t *testing.T) {
	runners := make(chan *consumer.Runner, 64)
	p := ledgerPipeline(runners)
	p.Config = func(c consumer.Config) consumer.Config {
		c.Failures.Unordered = true
		c.Failures.InPlaceAttempts = 1
		return c
	}
	checkReport(t, kscopetest.Scope(t, p))
	close(runners)
	var routed int64
	for r := range runners {
		routed += r.Stats().Failures.RetryTopic
	}
	if routed == 0 {
		t.Error("no record went to a retry topic under an Unordered policy with one attempt in place")
	}
}

// New refuses what cannot work, saying what to change: no handler, no
// file, a file open read-only.
func TestNewRefuses(t *testing.T) {
	cfg := consumer.Config{Brokers: []string{"localhost:9092"}, Group: "ledger", Topics: []string{"payments"}}
	h := boltscope.HandlerFunc(applyPayment)
	path := filepath.Join(t.TempDir(), "ledger.db")
	rw, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err == nil {
		err = rw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	ro, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ro.Close() })
	for _, c := range []struct {
		name string
		db   *bolt.DB
		h    boltscope.Handler
		want string
	}{
		{"nil handler", openFile(t), nil, "kscope: boltscope.New's handler: is nil; pass the function"},
		{"nil db", nil, h, "kscope: boltscope.New's db: is nil; open the file with bolt.Open"},
		{"read-only db", ro, h, path + " is open read-only; the scope writes each record's inbox entry in it, so open it without bolt.Options.ReadOnly"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := boltscope.New(cfg, c.db, c.h)
			var ce *consumer.ConfigError
			if r != nil || !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: runner %v, error %v; want a *consumer.ConfigError saying %q", r, err, c.want)
			}
		})
	}
}

// A file closed before Run fails Run at start, before it consumes
// anything (no broker is needed to see it), naming the file.
func TestRunFailsAtStartOnAClosedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r, err := boltscope.New(consumer.Config{Brokers: []string{"127.0.0.1:1"}, Group: "ledger", Topics: []string{"payments"}},
		db, boltscope.HandlerFunc(applyPayment))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = r.Run(ctx)
	if !errors.Is(err, berrors.ErrDatabaseNotOpen) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Run on a closed file: %v; want bolt.ErrDatabaseNotOpen, naming %s", err, path)
	}
}
