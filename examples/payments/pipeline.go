package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/intent"
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

// gateway is the payment gateway's client. Each capture is charged once,
// with its payment intent as the idempotency key: kscope's intent store
// records the intent before the call and, when a crash left it in flight,
// asks the gateway whether the charge went through before calling again.
type gateway struct {
	url     string
	http    *http.Client
	intents *intent.Store
}

func newGateway(url string) *gateway {
	return &gateway{url: url, http: &http.Client{Timeout: 5 * time.Second}, intents: intent.New(nil, "")}
}

// charge returns the call that charges c: the gateway answers "captured"
// or "declined", or fails (a 503 is retried).
func (g *gateway) charge(c Capture) intent.Call {
	return func(ctx context.Context, key string) ([]byte, error) {
		body, _ := json.Marshal(c)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/charges", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Idempotency-Key", key)
		return httpSend(g.http, req)
	}
}

// lookup asks the gateway for the answer it gave a charge with key, if it
// saw one.
func (g *gateway) lookup(ctx context.Context, key string) ([]byte, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url+"/charges/"+url.PathEscape(key), nil)
	if err != nil {
		return nil, false, err
	}
	res, err := httpSend(g.http, req)
	if errors.Is(err, errNotFound) {
		return nil, false, nil
	}
	return res, err == nil, err
}

var errNotFound = errors.New("gateway: no such charge")

// httpSend sends req and returns the body of a 200 answer; a 404 is
// errNotFound, any other status an error.
func httpSend(c *http.Client, req *http.Request) ([]byte, error) {
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return nil, err
	case resp.StatusCode == http.StatusNotFound:
		return nil, errNotFound
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("gateway: %s", resp.Status)
	}
	return body, nil
}

// ErrDeclined is the gateway's business "no".
var ErrDeclined = errors.New("gateway: card declined")

// handle books one capture in the ledger, inside the transaction that also
// holds its inbox row, its account's version and its intent's answer.
func (g *gateway) handle(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
	var c Capture
	if err := json.Unmarshal(r.Value, &c); err != nil || c.Intent == "" {
		return consumer.DecodeError(fmt.Errorf("malformed capture: %v", err))
	}
	check, _ := sequence.FromContext(ctx)
	res, _, err := g.intents.Do(ctx, tx, c.Intent, g.charge(c), g.lookup)
	if err != nil {
		return consumer.Retryable(err)
	}
	status := string(res)
	if _, err := tx.Exec(ctx, `INSERT INTO ledger (intent, account, amount, status, version) VALUES ($1, $2, $3, $4, $5)`,
		c.Intent, c.Account, c.Amount, status, check.Version); err != nil {
		return err
	}
	if err := booked(ctx, tx, c, status); err != nil { // published if and only if this booking commits
		return err
	}
	if status == "declined" {
		return consumer.Skip(ErrDeclined) // a business outcome: booked as declined, not dead-lettered
	}
	return nil
}

// failures is the pipeline's failure policy, as the ledger's entry in the
// service's policy declares it: a short retry ladder, so the demo's flaky
// gateway recovers within seconds.
func failures() (retrytopic.Policy, error) {
	c, err := entry("ledger", group)
	if err != nil {
		return retrytopic.Policy{}, err
	}
	cfg, _, err := c.Apply(consumer.Config{})
	return cfg.Failures, err
}

// options are the pipeline's DB-scope options (the pool aside): account
// events carry versions, their gaps handled as the policy says.
func options(pool *pgxpool.Pool) (dbscope.Options, error) {
	c, err := entry("ledger", group)
	if err != nil {
		return dbscope.Options{}, err
	}
	versions, _ := c.ApplyGaps(&sequence.Config{}, quietLogger())
	return dbscope.Options{Pool: pool, Versions: versions}, nil
}

// ledgerShards is the ledger consumer's key-shard count. Each key-shard
// can be between a dead letter's acknowledgement and the transaction that
// records it when the consumer is killed: the demo's bound on doubled DLT
// records.
const ledgerShards = 16

// newPipeline builds the payments pipeline in the DB scope.
func newPipeline(brokers []string, pool *pgxpool.Pool, group, gatewayURL string, commitEvery time.Duration) (*dbscope.Runner, error) {
	g := newGateway(gatewayURL)
	o, err := options(pool)
	if err != nil {
		return nil, err
	}
	o.Consumer = group // the inbox's name for this pipeline, set so that it stays if the group is ever renamed
	pol, err := entry("ledger", group)
	if err != nil {
		return nil, err
	}
	// The failure policy and the dead-letter topic's retention come from
	// the policy file.
	cfg, _, err := pol.Apply(consumer.Config{
		Brokers:        brokers,
		Group:          group,
		Topics:         []string{topic},
		Shards:         ledgerShards,
		CommitInterval: commitEvery,
		Logger:         quietLogger(),
		// A killed consumer's partitions move on after the session
		// timeout: keep it at the broker's minimum.
		ClientOptions: []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(500 * time.Millisecond)},
	})
	if err != nil {
		return nil, err
	}
	return dbscope.New(cfg, o, dbscope.HandlerFunc(g.handle))
}
