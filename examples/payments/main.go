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
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
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
	flag.StringVar(&probesAddr, "probes", "", "serve the ledger consumer's Kubernetes probes, /livez and /readyz, on this address (such as :8081); none when empty")
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
	OutboxPublished        int     `json:"outbox_published"`
	OutboxDuplicates       int     `json:"outbox_duplicates"`
	OutboxLost             int     `json:"outbox_lost"`
	Notifications          int     `json:"notifications"`
	NotificationDuplicates int     `json:"notification_duplicates"`
	Seconds                float64 `json:"seconds"`
}

func run() (int, error) {
	start := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kafka, err := devenv.StartKafka(ctx)
	if err != nil {
		return 1, err
	}
	defer kafka.Close()
	pg, err := devenv.StartPostgres(ctx)
	if err != nil {
		return 1, err
	}
	defer pg.Close()
	// Every table of the run, kscope's included, in a schema of its own.
	dbURL, dropSchema, err := pg.Schema(ctx, devenv.RunName("payments"))
	if err != nil {
		return 1, err
	}
	defer dropSchema(context.WithoutCancel(ctx)) //nolint:errcheck // best effort
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return 1, err
	}
	defer pool.Close()
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		return 1, err
	}
	for _, ddl := range []string{ledgerDDL, notificationsDDL} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			return 1, err
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.Brokers...))
	if err != nil {
		return 1, err
	}
	defer cl.Close()
	adm := admin{kadm.NewClient(cl)}
	if _, err := adm.CreateTopic(ctx, 6, -1, nil, topic); err != nil {
		return 1, err
	}
	if _, err := adm.CreateTopic(ctx, outboxParts, -1, nil, bookedTopic); err != nil {
		return 1, err
	}
	// Remove the run's topics and groups, and those kscope created for
	// them (failure topics, the relay's group and position topic).
	defer func() {
		ctx := context.WithoutCancel(ctx)
		kafka.Remove(ctx, group, topic, bookedTopic)                                                 //nolint:errcheck // best effort
		kafka.Remove(ctx, notifierGroup)                                                             //nolint:errcheck // best effort
		kafka.Remove(ctx, "kscope-outbox-"+outboxName(), "kscope-outbox-"+outboxName()+".positions") //nolint:errcheck // best effort
	}()
	fmt.Printf("kafka: %s %v · postgres: %s\n", kafka.Kind, kafka.Brokers, pg.Kind)

	s := generate(rand.New(rand.NewPCG(7, 11)))
	if err := cl.ProduceSync(ctx, s.records...).FirstErr(); err != nil {
		return 1, err
	}
	fmt.Printf("produced %d events: %d payment intents, %d redelivered, %d poison, %d declines, %d version swaps\n",
		len(s.records), len(s.valid), s.redeliv, s.poison, s.declined, s.swapped)

	gw, err := startGateway()
	if err != nil {
		return 1, err
	}
	defer gw.Close()
	env := []string{roleEnv + "=consumer", runEnv + "=" + devenv.RunID, "KAFKA_BROKERS=" + strings.Join(kafka.Brokers, ","), dbEnv + "=" + dbURL, gwEnv + "=" + gw.URL}
	if probesAddr != "" {
		env = append(env, probesEnv+"="+probesAddr)
		fmt.Printf("ledger consumer probes: http://%s/livez and /readyz\n", probesAddr)
	}
	// The notification side: the outbox relay publishes payment.booked,
	// the notifier consumes it. Both run as child processes too; the relay
	// is SIGKILLed once a third of the events are out, and restarted.
	side := func(role string) []string { return append(append([]string(nil), env...), roleEnv+"="+role) }
	relay, err := startConsumer(side("relay"))
	if err != nil {
		return 1, err
	}
	notifier, err := startConsumer(side("notifier"))
	if err != nil {
		relay.Process.Kill()
		return 1, err
	}
	defer func() {
		for _, c := range []*exec.Cmd{relay, notifier} {
			c.Process.Signal(syscall.SIGTERM)
			c.Wait()
		}
	}()
	relayKilled := false
	killRelay := func() {
		if relayKilled || published(ctx, pool) < len(s.valid)/3 {
			return
		}
		relayKilled = true
		relay.Process.Kill()
		relay.Wait()
		fmt.Println("  outbox relay killed with SIGKILL; restarting")
		if relay, err = startConsumer(side("relay")); err != nil {
			fmt.Fprintln(os.Stderr, "restarting the relay:", err)
		}
	}
	ledgerRows := func() int {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&n)
		return n
	}
	progress := func(phase string) {
		var lag int64
		ends, com := adm.endOffsets(ctx, topic), adm.committed(ctx, group, topic)
		for p, e := range ends {
			lag += e - com[p]
		}
		dlt := adm.endOffsets(ctx, retrytopic.DLTopic(group))
		var dl int64
		for _, e := range dlt {
			dl += e
		}
		// Records waiting in the retry topics, and keys held behind a
		// record that is in them: lag alone says 0 while they wait.
		var backlog int64
		for _, d := range failures().Ladder {
			rt := retrytopic.RetryTopic(group, d)
			ends, com := adm.endOffsets(ctx, rt), adm.committed(ctx, group, rt)
			for p, e := range ends {
				backlog += max(e-com[p], 0)
			}
		}
		var parked int
		pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT topic, key FROM kscope_parked UNION SELECT topic, key FROM kscope_waiting) AS k`).Scan(&parked)
		fmt.Printf("  [%5.1fs] %-9s ledger rows %4d · lag %4d · retry backlog %3d · parked keys %2d · DLT records %d\n",
			time.Since(start).Seconds(), phase, ledgerRows(), lag, backlog, parked, dl)
	}
	waitUntil := func(phase string, d time.Duration, cond func() bool) error {
		deadline := time.Now().Add(d)
		last := time.Time{}
		for !cond() {
			killRelay()
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: not done after %s", phase, d)
			}
			if time.Since(last) > time.Second {
				progress(phase)
				last = time.Now()
			}
			time.Sleep(50 * time.Millisecond)
		}
		progress(phase)
		return nil
	}

	// Run, crash half way (SIGKILL), restart.
	child, err := startConsumer(env)
	if err != nil {
		return 1, err
	}
	if err := waitUntil("running", time.Minute, func() bool { return ledgerRows() >= len(s.valid)/2 }); err != nil {
		child.Process.Kill()
		return 1, err
	}
	child.Process.Kill()
	child.Wait()
	fmt.Println("  consumer killed with SIGKILL; restarting")
	child, err = startConsumer(env)
	if err != nil {
		return 1, err
	}
	done := func() bool { return ledgerRows() >= len(s.valid) && adm.caughtUp(ctx, group, topic) }
	if err := waitUntil("restarted", 90*time.Second, done); err != nil {
		child.Process.Kill()
		return 1, err
	}
	child.Process.Signal(syscall.SIGTERM)
	child.Wait()

	// Replay the whole topic: reset the group and consume it again.
	before := ledgerRows()
	if _, err := adm.DeleteGroup(ctx, group); err != nil {
		return 1, fmt.Errorf("resetting the group: %w", err)
	}
	fmt.Println("  replaying the whole topic from the start")
	child, err = startConsumer(env)
	if err != nil {
		return 1, err
	}
	if err := waitUntil("replay", time.Minute, func() bool { return adm.caughtUp(ctx, group, topic) }); err != nil {
		child.Process.Kill()
		return 1, err
	}
	child.Process.Signal(syscall.SIGTERM)
	child.Wait()
	after := ledgerRows()
	notified := func() int {
		var n int
		pool.QueryRow(ctx, `SELECT count(DISTINCT intent) FROM notifications`).Scan(&n)
		return n
	}
	if err := waitUntil("notify", time.Minute, func() bool { return relayKilled && notified() >= after }); err != nil {
		return 1, err
	}

	rep, err := measure(ctx, kafka.Brokers, adm, pool, s)
	if err != nil {
		return 1, err
	}
	rep.ReplayNoopRate = 1 - float64(after-before)/float64(len(s.records))
	rep.GatewayCharges, rep.GatewayChargesDuplicated, rep.GatewayReconciled = gw.counts()
	if err := measureNotifications(ctx, kafka.Brokers, adm, pool, gw, &rep); err != nil {
		return 1, err
	}
	rep.Seconds = float64(time.Since(start).Milliseconds()) / 1000
	// The inbox remembers a dead letter, so the replay routes nothing
	// again; only a kill between a DLT produce's acknowledgement and the
	// transaction that records it can double one (the demo kills once).
	rep.OK = rep.Lost == 0 && rep.DuplicateEffects == 0 && rep.DeadLettered == s.poison &&
		rep.DLTRecords >= rep.DeadLettered && rep.DLTRecords <= rep.DeadLettered+1 &&
		rep.Effects == len(s.valid) && rep.ReplayNoopRate == 1 && rep.GapsHealed == rep.GapsDetected &&
		rep.GatewayChargesDuplicated == 0 && rep.GatewayCharges == rep.Effects-rep.Skipped &&
		rep.OutboxPublished == rep.Effects && rep.OutboxDuplicates == 0 && rep.OutboxLost == 0 &&
		rep.Notifications == rep.Effects && rep.NotificationDuplicates == 0
	fmt.Println()
	fmt.Printf("%d payment intents booked exactly once (%d declined, recorded as such), %d poison records dead-lettered\n",
		rep.Effects, rep.Skipped, rep.DeadLettered)
	fmt.Printf("(in %d DLT records: the replay dead-letters nothing again; a kill between a DLT acknowledgement and its inbox row can double one),\n", rep.DLTRecords)
	fmt.Printf("%d charges at the gateway, %d payment intents charged twice, %d reconciled after a crash instead of charged again,\n",
		rep.GatewayCharges, rep.GatewayChargesDuplicated, rep.GatewayReconciled)
	fmt.Printf("%d payment.booked events published through the outbox (%d read twice, %d missing), %d notifications sent (%d twice),\n",
		rep.OutboxPublished, rep.OutboxDuplicates, rep.OutboxLost, rep.Notifications, rep.NotificationDuplicates)
	fmt.Printf("%d intents retried, %d version gaps detected and %d healed, replay changed nothing (%.0f%% no-ops): %v\n",
		rep.Retried, rep.GapsDetected, rep.GapsHealed, rep.ReplayNoopRate*100, map[bool]string{true: "OK", false: "FAILED"}[rep.OK])
	line, _ := json.Marshal(rep)
	fmt.Println(string(line))
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
