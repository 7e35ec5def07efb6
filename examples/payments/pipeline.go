package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
)

// Capture is a payment-capture event, keyed by account. Its payment intent
// id travels as the message-id header (the idempotency key) and its
// per-account version as the version header.
type Capture struct {
	Intent  string `json:"intent"`
	Account string `json:"account"`
	Amount  int64  `json:"amount_cents"`
	// Gateway tells the simulated payment gateway how to answer:
	// "ok", "declined", or "flaky" (503 twice, then ok).
	Gateway string `json:"gateway"`
}

// ledgerDDL is the service's own table: one row per capture booked.
const ledgerDDL = `CREATE TABLE IF NOT EXISTS ledger (
	n       bigserial PRIMARY KEY,
	intent  text   NOT NULL,
	account text   NOT NULL,
	amount  bigint NOT NULL,
	status  text   NOT NULL, -- captured | declined
	version bigint NOT NULL
)`

// ErrDeclined is the gateway's business "no".
var ErrDeclined = errors.New("gateway: card declined")

// gateway simulates the payment gateway.
type gateway struct {
	mu    sync.Mutex
	calls map[string]int
}

func (g *gateway) charge(c Capture) error {
	g.mu.Lock()
	g.calls[c.Intent]++
	n := g.calls[c.Intent]
	g.mu.Unlock()
	switch c.Gateway {
	case "declined":
		return ErrDeclined
	case "flaky":
		if n <= 2 {
			return errors.New("gateway: 503 service unavailable")
		}
	}
	return nil
}

// handle books one capture in the ledger, inside the transaction that also
// holds its inbox row and its account's version.
func (g *gateway) handle(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
	var c Capture
	if err := json.Unmarshal(r.Value, &c); err != nil || c.Intent == "" {
		return consumer.DecodeError(fmt.Errorf("malformed capture: %v", err))
	}
	check, _ := sequence.FromContext(ctx)
	status := "captured"
	err := g.charge(c)
	switch {
	case errors.Is(err, ErrDeclined):
		status = "declined"
	case err != nil:
		return consumer.Retryable(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO ledger (intent, account, amount, status, version) VALUES ($1, $2, $3, $4, $5)`,
		c.Intent, c.Account, c.Amount, status, check.Version); err != nil {
		return err
	}
	if status == "declined" {
		return consumer.Skip(ErrDeclined) // a business outcome: booked as declined, not dead-lettered
	}
	return nil
}

// failures is the pipeline's failure policy: a short retry ladder, so the
// demo's flaky gateway recovers within seconds.
func failures() retrytopic.Policy {
	return retrytopic.Policy{
		Backoff: 50 * time.Millisecond, MaxBackoff: time.Second,
		InPlaceAttempts: 2, Ladder: []time.Duration{time.Second, 2 * time.Second},
	}
}

// options are the pipeline's DB-scope options (the pool aside): account
// events carry versions.
func options(pool *pgxpool.Pool) dbscope.Options {
	return dbscope.Options{Pool: pool, Versions: &sequence.Config{}}
}

// newPipeline builds the payments pipeline in the DB scope.
func newPipeline(brokers []string, pool *pgxpool.Pool, group string, commitEvery time.Duration) (*dbscope.Runner, error) {
	g := &gateway{calls: map[string]int{}}
	return dbscope.New(consumer.Config{
		Brokers:        brokers,
		Group:          group,
		Topics:         []string{topic},
		Shards:         16,
		CommitInterval: commitEvery,
		Logger:         quietLogger(),
		// A killed consumer's partitions move on after the session
		// timeout: keep it at the broker's minimum.
		ClientOptions: []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(500 * time.Millisecond)},
		Failures:      failures(),
	}, options(pool), dbscope.HandlerFunc(g.handle))
}
