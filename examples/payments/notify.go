package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/intent"
	"github.com/kscope-dev/kscope/outbox"
	"github.com/kscope-dev/kscope/retrytopic"
)

// outboxParts is the outbox's partition count, and payment.booked's.
const outboxParts = 4

// Booked is the payment.booked event the ledger writes to the outbox in
// the transaction that books a capture.
type Booked struct {
	Intent  string `json:"intent"`
	Account string `json:"account"`
	Amount  int64  `json:"amount_cents"`
	Status  string `json:"status"`
}

// notificationsDDL is the notification service's table: one row per
// notification sent.
const notificationsDDL = `CREATE TABLE IF NOT EXISTS notifications (
	n       bigserial PRIMARY KEY,
	event   text NOT NULL, -- the payment.booked record's identity
	intent  text NOT NULL,
	status  text NOT NULL
)`

// booked writes the payment.booked event of a booked capture to the
// outbox, in the booking transaction: it is published if and only if the
// booking commits.
func booked(ctx context.Context, tx pgx.Tx, c Capture, status string) error {
	v, _ := json.Marshal(Booked{Intent: c.Intent, Account: c.Account, Amount: c.Amount, Status: status})
	_, err := outbox.Writer{Outbox: outboxName(), Partitions: outboxParts}.Add(ctx, tx, &kgo.Record{Topic: bookedTopic, Key: []byte(c.Account), Value: v})
	return err
}

// runRelay is the relay child process: it publishes the outbox until
// SIGTERM (or SIGKILL).
func runRelay(ctx context.Context, pool *pgxpool.Pool, brokers []string) error {
	r, err := outbox.New(outbox.Options{Brokers: brokers, Pool: pool, Outbox: outboxName(), Partitions: outboxParts, PollInterval: 200 * time.Millisecond,
		Logger: quietLogger(), ClientOptions: []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(500 * time.Millisecond)}})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// notifier sends a "payment booked" message through the messaging
// provider, once per event: the event's kscope identity is the idempotency
// key of the send, recorded as an intent before it.
type notifier struct {
	url     string
	http    *http.Client
	intents *intent.Store
}

func (n *notifier) handle(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
	var b Booked
	if err := json.Unmarshal(r.Value, &b); err != nil {
		return consumer.DecodeError(err)
	}
	event := consumer.Identity{}.Of(r) // the outbox record's identity: stable across relay crashes
	send := func(ctx context.Context, key string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.url+"/notify", bytes.NewReader(r.Value))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Idempotency-Key", key)
		return httpSend(n.http, req)
	}
	lookup := func(ctx context.Context, key string) ([]byte, bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.url+"/notify/"+url.PathEscape(key), nil)
		if err != nil {
			return nil, false, err
		}
		res, err := httpSend(n.http, req)
		if err == errNotFound {
			return nil, false, nil
		}
		return res, err == nil, err
	}
	if _, _, err := n.intents.Do(ctx, tx, event, send, lookup); err != nil {
		return consumer.Retryable(err)
	}
	_, err := tx.Exec(ctx, `INSERT INTO notifications (event, intent, status) VALUES ($1, $2, $3)`, event, b.Intent, b.Status)
	return err
}

// newNotifier builds the notification service: a DB-scope consumer of
// payment.booked.
func newNotifier(brokers []string, pool *pgxpool.Pool, providerURL string) (*dbscope.Runner, error) {
	n := &notifier{url: providerURL, http: &http.Client{Timeout: 5 * time.Second}, intents: intent.New(nil, "")}
	pol, err := entry("notifications", notifierGroup)
	if err != nil {
		return nil, err
	}
	// Its failure policy (retries in place only) comes from the policy file.
	cfg, _, err := pol.Apply(consumer.Config{
		Brokers:        brokers,
		Group:          notifierGroup,
		Topics:         []string{bookedTopic},
		Shards:         8,
		CommitInterval: 100 * time.Millisecond,
		Logger:         quietLogger(),
		ClientOptions:  []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(500 * time.Millisecond)},
	})
	if err != nil {
		return nil, err
	}
	return dbscope.New(cfg, dbscope.Options{Pool: pool, Consumer: notifierGroup}, dbscope.HandlerFunc(n.handle))
}

// runChild runs the child process role names: the ledger consumer, the
// relay or the notifier, until SIGTERM (or SIGKILL).
func runChild(ctx context.Context, role string) error {
	pool, err := pgxpool.New(ctx, os.Getenv(dbEnv))
	if err != nil {
		return err
	}
	defer pool.Close()
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	switch role {
	case "relay":
		return runRelay(ctx, pool, brokers)
	case "notifier":
		r, err := newNotifier(brokers, pool, os.Getenv(gwEnv))
		if err != nil {
			return err
		}
		return r.Run(ctx)
	case "consumer":
		r, err := newPipeline(brokers, pool, group, os.Getenv(gwEnv), 100*time.Millisecond)
		if err != nil {
			return err
		}
		if addr := os.Getenv(probesEnv); addr != "" {
			// Kubernetes probes for the ledger: /readyz is 503 until
			// the member joined, and while the brokers do not answer;
			// /livez turns 503 once Run returned an error.
			ctx, stop := context.WithCancel(ctx)
			wait, err := serveProbes(ctx, addr, r)
			if err != nil {
				stop()
				return err
			}
			defer func() { stop(); wait() }() // once Run returned
		}
		return r.Run(ctx)
	}
	return fmt.Errorf("unknown role %q", role)
}

// published counts the outbox rows the relay has published so far: the
// sequence numbers handed out, less the rows still in the table (a row is
// deleted once the relay's committed position passes it).
func published(ctx context.Context, pool *pgxpool.Pool) int {
	var n int
	pool.QueryRow(ctx, `SELECT coalesce(sum(next_seq - 1), 0) - (SELECT count(*) FROM kscope_outbox) FROM kscope_outbox_sequences`).Scan(&n) //nolint:errcheck // 0 while unknown
	return n
}

// measureNotifications fills in the notification side of the report.
func measureNotifications(ctx context.Context, brokers []string, adm admin, pool *pgxpool.Pool, gw *fakeGateway, rep *report) error {
	ids := map[string]int{}
	intents := map[string]bool{}
	recs, err := readAll(ctx, brokers, adm, bookedTopic)
	if err != nil {
		return err
	}
	for _, r := range recs {
		ids[header(r, retrytopic.HeaderID)]++
		var b Booked
		if json.Unmarshal(r.Value, &b) == nil {
			intents[b.Intent] = true
		}
	}
	rep.OutboxPublished = len(ids)
	for _, n := range ids {
		rep.OutboxDuplicates += n - 1
	}
	rows, err := pool.Query(ctx, `SELECT DISTINCT intent FROM ledger`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var i string
		if err := rows.Scan(&i); err != nil {
			rows.Close()
			return err
		}
		if !intents[i] {
			rep.OutboxLost++
		}
	}
	rows.Close()
	var total, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event) FROM notifications`).Scan(&total, &distinct); err != nil {
		return err
	}
	rep.Notifications = distinct
	rep.NotificationDuplicates = total - distinct + gw.notifyDuplicates()
	return nil
}
