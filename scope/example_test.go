package scope_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/scope"
)

// ledger is a scope whose store is a map: each record's effect and its
// inbox entry are written together under one lock, standing in for one
// transaction of a real store, and the record is done only after.
type ledger struct {
	mu       sync.Mutex
	inbox    map[string]bool
	balances map[string]int
	identity consumer.Identity
	f        scope.Failures[*consumer.Record]
}

// The contract's interfaces ledger implements: a changed signature is a
// compile error here.
var (
	_ scope.Scope[*consumer.Record]      = (*ledger)(nil)
	_ scope.EngineUser[*consumer.Record] = (*ledger)(nil)
)

// UseEngine keeps the runner's failure policy.
func (l *ledger) UseEngine(e scope.Engine[*consumer.Record]) { l.f = e.Failures() }

// Process applies each record once: a record already in the inbox is a
// redelivery, done without a second effect. A failing record is retried in
// place, then routed (skipped or dead-lettered) as the policy decides; it
// is done only once its route was acknowledged.
func (l *ledger) Process(ctx context.Context, batch []*consumer.Record, done func(*consumer.Record)) {
	for _, r := range batch {
		a := l.f.Attempts(ctx, r, false, done, func() error { return l.apply(r) })
		if !a.OK {
			return // stopped or revoked: the record's next owner handles it
		}
		if a.Err != nil {
			if err := l.f.Route(ctx, r, a.Err, a.Step, a.N, a.First); err != nil {
				return // not acknowledged: the record is not done
			}
		}
		done(r)
	}
}

func (l *ledger) apply(r *consumer.Record) error {
	id := l.identity.Of(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inbox[id] {
		return nil
	}
	l.inbox[id] = true
	l.balances[string(r.Key)] += len(r.Value)
	return nil
}

// A scope of a service's own runs on the same runner as kscope's scopes,
// with the same per-key order, failure routing and commit watermark.
func Example() {
	l := &ledger{inbox: map[string]bool{}, balances: map[string]int{}}
	r, err := consumer.NewScoped(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "ledger",
		Topics:  []string{"payments"},
	}, l)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
