// Command payments is kscope's demo (make demo): a payments ledger in the DB
// scope, driven through everything that goes wrong in production.
//
// It starts an in-process Kafka (kfake) and a throwaway PostgreSQL (or uses
// KAFKA_BROKERS and DATABASE_URL, in topics, groups and a schema of the
// run's own that it removes when it ends), produces a stream of payment captures
// with redeliveries, poison records, transient gateway failures, declines
// and out-of-order versions, runs the consumer as a child process, kills it
// with SIGKILL half way and restarts it, then replays the whole topic. The
// ledger charges a gateway (run by the demo, not deduplicating) through an
// intent per payment and writes a payment.booked event to the outbox in
// each booking transaction; a relay child (SIGKILLed once) publishes them
// and a notifier child sends one notification per event. It checks the
// outcome against the database, the topics and the gateway and prints, as
// its last line, one JSON object; it exits non-zero when an invariant
// fails.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/devenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

const (
	roleEnv  = "KSCOPE_DEMO_ROLE"
	runEnv   = "KSCOPE_DEMO_RUN"
	dbEnv    = "KSCOPE_DEMO_DB"
	gwEnv    = "KSCOPE_DEMO_GATEWAY"
	accounts = 40
	perAcct  = 25
)

// quietLogger keeps the consumer's own logs out of the demo's output; the
// demo reports progress itself, and Run's error, if any, is printed.
func quietLogger() *slog.Logger {
	return slog.New(slog.DiscardHandler)
}

func main() {
	if os.Getenv(roleEnv) != "" {
		os.Exit(runConsumer())
	}
	flag.StringVar(&probesAddr, "probes", os.Getenv("KSCOPE_PROBES_ADDR"), "serve the ledger consumer's Kubernetes probes, /livez and /readyz, on this address (such as :8081; by default $KSCOPE_PROBES_ADDR); none when empty")
	flag.Parse()
	code, err := run()
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

// runConsumer is a child process: the ledger consumer, the outbox relay
// or the notifier (roleEnv says which), until SIGTERM (or SIGKILL).
func runConsumer() int {
	devenv.RunID = os.Getenv(runEnv) // the parent's names
	setNames()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := runChild(ctx, os.Getenv(roleEnv)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

type stream struct {
	records  []*kgo.Record
	valid    map[string]bool // intents of well-formed captures
	declined int
	poison   int
	redeliv  int
	swapped  int
}

// generate builds the input: per account, versions 1..perAcct; a few
// captures are declined, flaky, delivered twice, or swapped with the next
// version; a few records are poison (malformed, without a version).
func generate(rng *rand.Rand) stream {
	s := stream{valid: map[string]bool{}}
	for a := 0; a < accounts; a++ {
		acct := fmt.Sprintf("acct-%03d", a)
		var recs []*kgo.Record
		for v := 1; v <= perAcct; v++ {
			c := Capture{Intent: fmt.Sprintf("pi_%s_%02d", acct, v), Account: acct, Amount: int64(100 + rng.IntN(9900)), Gateway: "ok"}
			switch p := rng.IntN(100); {
			case p < 6:
				c.Gateway = "declined"
				s.declined++
			case p < 12:
				c.Gateway = "flaky"
			}
			body, _ := json.Marshal(c)
			rec := &kgo.Record{Topic: topic, Key: []byte(acct), Value: body, Headers: []kgo.RecordHeader{
				{Key: "message-id", Value: []byte(c.Intent)}, {Key: "version", Value: []byte(fmt.Sprint(v))},
			}}
			s.valid[c.Intent] = true
			recs = append(recs, rec)
			if rng.IntN(100) < 4 { // the producer retried: the same event again
				recs = append(recs, &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value, Headers: rec.Headers})
				s.redeliv++
			}
			if rng.IntN(100) < 3 { // poison: not JSON, no version
				recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(acct), Value: []byte("{amount: ???"),
					Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte(fmt.Sprintf("bad_%s_%02d", acct, v))}}})
				s.poison++
			}
		}
		if a%10 == 3 { // two versions arrive out of order: a gap, then its fill
			i := len(recs) / 2
			recs[i], recs[i+1] = recs[i+1], recs[i]
			s.swapped++
		}
		s.records = append(s.records, recs...)
	}
	return s
}

type report struct {
	OK               bool    `json:"ok"`
	Events           int     `json:"events"`
	UniqueEvents     int     `json:"unique_events"`
	Deliveries       int     `json:"deliveries"`
	Effects          int     `json:"effects"`
	DuplicateEffects int     `json:"duplicate_effects"`
	Lost             int     `json:"lost"`
	Skipped          int     `json:"skipped"`
	Retried          int     `json:"retried"`
	DeadLettered     int     `json:"dead_lettered"`
	DLTRecords       int     `json:"dlt_records"`
	DLTAddedByReplay int     `json:"dlt_added_by_replay"`
	GapsDetected     int     `json:"gaps_detected"`
	GapsHealed       int     `json:"gaps_healed"`
	ReplayNoopRate   float64 `json:"replay_noop_rate"`
	// At the payment gateway (which does not deduplicate): successful
	// charges, payment intents charged more than once, and lookups by
	// idempotency key that found an answer (intents a crash left in
	// flight, reconciled instead of charged again).
	GatewayCharges           int `json:"gateway_charges"`
	GatewayChargesDuplicated int `json:"gateway_charges_duplicated"`
	GatewayReconciled        int `json:"gateway_reconciled"`
	// The notification side: payment.booked events the relay published
	// (distinct, as a read_committed reader sees them), events read twice,
	// booked payments without an event, notifications the notifier
	// applied, and sends the messaging provider got twice for one event
	// (by idempotency key).
	OutboxPublished        int `json:"outbox_published"`
	OutboxDuplicates       int `json:"outbox_duplicates"`
	OutboxLost             int `json:"outbox_lost"`
	Notifications          int `json:"notifications"`
	NotificationDuplicates int `json:"notification_duplicates"`
	// PolicyChecked says that the service's policy file (kscope-policy.yaml)
	// was loaded and checked at start, with an entry for each consumer
	// group; the runners' failure policies and gap options come from it.
	PolicyChecked bool    `json:"policy_checked"`
	Seconds       float64 `json:"seconds"`
}

// run is the demo, step by step: the servers, the input, the gateway and
// the notification side; the ledger consumer through a crash and a replay;
// then the outcome, checked.
func run() (int, error) {
	start := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d := &demo{start: start}
	defer d.close()
	if err := checkPolicy(); err != nil {
		return 1, err
	}
	if err := d.setUp(ctx); err != nil {
		return 1, err
	}
	fmt.Printf("kafka: %s %v · postgres: %s\n", d.kafka.Kind, d.kafka.Brokers, d.pg.Kind)
	if err := d.produce(ctx); err != nil {
		return 1, err
	}
	if err := d.startGateway(); err != nil {
		return 1, err
	}
	if err := d.startNotificationSide(); err != nil {
		return 1, err
	}
	if err := d.crashAndRestart(ctx); err != nil {
		return 1, err
	}
	before, after, err := d.replay(ctx)
	if err != nil {
		return 1, err
	}
	if err := d.waitUntil(ctx, "notify", time.Minute, func() bool { return d.relayKilled && d.notified(ctx) >= after }); err != nil {
		return 1, err
	}
	rep, err := d.outcome(ctx, before, after)
	if err != nil {
		return 1, err
	}
	rep.PolicyChecked = true // checkPolicy passed
	printOutcome(rep)
	if !rep.OK {
		return 1, nil
	}
	return 0, nil
}

// measure computes the report from the database and the topics.
func measure(ctx context.Context, brokers []string, adm admin, pool *pgxpool.Pool, s stream) (report, error) {
	var rep report
	rep.Events = len(s.records)
	ids := map[string]bool{}
	for _, r := range s.records {
		for _, h := range r.Headers {
			if h.Key == "message-id" {
				ids[string(h.Value)] = true
			}
		}
	}
	rep.UniqueEvents = len(ids)
	var distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT intent), count(*) FILTER (WHERE status = 'declined') FROM ledger`).
		Scan(&rep.Effects, &distinct, &rep.Skipped); err != nil {
		return rep, err
	}
	rep.DuplicateEffects = rep.Effects - distinct
	booked := map[string]bool{}
	rows, err := pool.Query(ctx, `SELECT DISTINCT intent FROM ledger`)
	if err != nil {
		return rep, err
	}
	for rows.Next() {
		var i string
		rows.Scan(&i)
		booked[i] = true
	}
	rows.Close()
	for i := range s.valid {
		if !booked[i] {
			rep.Lost++
		}
	}
	// Routing to the DLT is at-least-once: poison consumed again (after the
	// crash, in the replay) is dead-lettered again, under the same
	// identity. Count identities.
	dead := map[string]bool{}
	dlt, err := readAll(ctx, brokers, adm, retrytopic.DLTopic(group))
	if err != nil {
		return rep, err
	}
	for _, r := range dlt {
		dead[header(r, retrytopic.HeaderID)] = true
		rep.DLTRecords++
	}
	rep.DeadLettered = len(dead)
	retried, gaps := map[string]bool{}, map[string]bool{}
	rep.Deliveries = rep.Events
	for _, d := range []time.Duration{time.Second, 2 * time.Second} {
		recs, err := readAll(ctx, brokers, adm, retrytopic.RetryTopic(group, d))
		if err != nil {
			return rep, err
		}
		for _, r := range recs {
			rep.Deliveries++
			id := header(r, "message-id")
			if header(r, retrytopic.HeaderVersionExpected) != "" {
				gaps[id] = true
			} else if header(r, retrytopic.HeaderParked) == "" {
				retried[id] = true
			}
		}
	}
	rep.Retried = len(retried)
	rep.GapsDetected = len(gaps)
	for id := range gaps {
		if booked[id] {
			rep.GapsHealed++
		}
	}
	return rep, nil
}

func startConsumer(env []string) (*exec.Cmd, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = io.Discard
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			fmt.Fprintln(os.Stderr, "  consumer:", sc.Text())
		}
	}()
	return cmd, nil
}
