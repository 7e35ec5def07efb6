package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
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

// The demo's steps (run), and what they share.

// demo is one run of the demo: its servers, clients and child processes,
// the input it produced, and what undoes it all when it ends.
type demo struct {
	start time.Time
	kafka *devenv.Kafka
	pg    *devenv.Postgres
	dbURL string // the run's schema
	pool  *pgxpool.Pool
	cl    *kgo.Client
	adm   admin
	s     stream
	gw    *fakeGateway
	// env is the environment of the child processes: the ledger
	// consumer's; the relay and the notifier add their role (side).
	env         []string
	relay       *exec.Cmd
	notifier    *exec.Cmd
	relayKilled bool
	// dltBeforeReplay is the DLT's record count when the replay starts.
	dltBeforeReplay int64
	undo            []func() // run in reverse order by close
}

// onClose has close run f: the last one given runs first.
func (d *demo) onClose(f func()) { d.undo = append(d.undo, f) }

// close stops the children and removes what the run created.
func (d *demo) close() {
	for i := len(d.undo) - 1; i >= 0; i-- {
		d.undo[i]()
	}
}

// setUp starts Kafka and PostgreSQL (or uses KAFKA_BROKERS and
// DATABASE_URL), then creates the run's tables and topics.
func (d *demo) setUp(ctx context.Context) error {
	kafka, err := devenv.StartKafka(ctx)
	if err != nil {
		return err
	}
	d.kafka = kafka
	d.onClose(kafka.Close)
	pg, err := devenv.StartPostgres(ctx)
	if err != nil {
		return err
	}
	d.pg = pg
	d.onClose(pg.Close)
	if err := d.createTables(ctx); err != nil {
		return err
	}
	return d.createTopics(ctx)
}

// createTables creates every table of the run, kscope's included, in a
// schema of its own.
func (d *demo) createTables(ctx context.Context) error {
	dbURL, dropSchema, err := d.pg.Schema(ctx, devenv.RunName("payments"))
	if err != nil {
		return err
	}
	d.dbURL = dbURL
	d.onClose(func() { dropSchema(context.WithoutCancel(ctx)) }) //nolint:errcheck // best effort
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	d.pool = pool
	d.onClose(pool.Close)
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		return err
	}
	for _, ddl := range []string{ledgerDDL, notificationsDDL} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			return err
		}
	}
	return nil
}

// createTopics creates the payment captures' topic and payment.booked.
func (d *demo) createTopics(ctx context.Context) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(d.kafka.Brokers...))
	if err != nil {
		return err
	}
	d.cl = cl
	d.onClose(cl.Close)
	d.adm = admin{kadm.NewClient(cl)}
	if _, err := d.adm.CreateTopic(ctx, 6, -1, nil, topic); err != nil {
		return err
	}
	if _, err := d.adm.CreateTopic(ctx, outboxParts, -1, nil, bookedTopic); err != nil {
		return err
	}
	// Remove the run's topics and groups, and those kscope created for
	// them (failure topics, the relay's group and position topic).
	kafka := d.kafka
	d.onClose(func() {
		ctx := context.WithoutCancel(ctx)
		kafka.Remove(ctx, group, topic, bookedTopic)                                                 //nolint:errcheck // best effort
		kafka.Remove(ctx, notifierGroup)                                                             //nolint:errcheck // best effort
		kafka.Remove(ctx, "kscope-outbox-"+outboxName(), "kscope-outbox-"+outboxName()+".positions") //nolint:errcheck // best effort
	})
	return nil
}

// produce writes the stream of payment captures (generate).
func (d *demo) produce(ctx context.Context) error {
	d.s = generate(rand.New(rand.NewPCG(7, 11)))
	if err := d.cl.ProduceSync(ctx, d.s.records...).FirstErr(); err != nil {
		return err
	}
	fmt.Printf("produced %d events: %d payment intents, %d redelivered, %d poison, %d declines, %d version swaps\n",
		len(d.s.records), len(d.s.valid), d.s.redeliv, d.s.poison, d.s.declined, d.s.swapped)
	return nil
}

// startGateway starts the payment gateway, and sets the environment of
// the child processes, which reach it there.
func (d *demo) startGateway() error {
	gw, err := startGateway()
	if err != nil {
		return err
	}
	d.gw = gw
	d.onClose(gw.Close)
	d.env = []string{roleEnv + "=consumer", runEnv + "=" + devenv.RunID, "KAFKA_BROKERS=" + strings.Join(d.kafka.Brokers, ","), dbEnv + "=" + d.dbURL, gwEnv + "=" + gw.URL}
	if probesAddr != "" {
		d.env = append(d.env, probesEnv+"="+probesAddr)
		fmt.Printf("ledger consumer probes: http://%s/livez and /readyz\n", probesAddr)
	}
	return nil
}

// side is the environment of the child process of role.
func (d *demo) side(role string) []string {
	return append(append([]string(nil), d.env...), roleEnv+"="+role)
}

// startNotificationSide starts the notification side: the outbox relay
// publishes payment.booked, the notifier consumes it. Both run as child
// processes too; the relay is SIGKILLed once a third of the events are
// out, and restarted (killRelayOnce).
func (d *demo) startNotificationSide() error {
	relay, err := startConsumer(d.side("relay"))
	if err != nil {
		return err
	}
	d.relay = relay
	notifier, err := startConsumer(d.side("notifier"))
	if err != nil {
		relay.Process.Kill()
		return err
	}
	d.notifier = notifier
	d.onClose(func() {
		for _, c := range []*exec.Cmd{d.relay, d.notifier} {
			c.Process.Signal(syscall.SIGTERM)
			c.Wait()
		}
	})
	return nil
}

// crashAndRestart runs the ledger consumer, kills it with SIGKILL half
// way, and restarts it until every payment is booked and its group has
// caught up; then stops it.
func (d *demo) crashAndRestart(ctx context.Context) error {
	child, err := startConsumer(d.env)
	if err != nil {
		return err
	}
	if err := d.waitUntil(ctx, "running", time.Minute, func() bool { return d.ledgerRows(ctx) >= len(d.s.valid)/2 }); err != nil {
		child.Process.Kill()
		return err
	}
	child.Process.Kill()
	child.Wait()
	fmt.Println("  consumer killed with SIGKILL; restarting")
	child, err = startConsumer(d.env)
	if err != nil {
		return err
	}
	done := func() bool { return d.ledgerRows(ctx) >= len(d.s.valid) && d.adm.caughtUp(ctx, group, topic) }
	if err := d.waitUntil(ctx, "restarted", 90*time.Second, done); err != nil {
		child.Process.Kill()
		return err
	}
	if probesAddr != "" {
		// The restarted consumer has joined and caught up: its
		// probes answer 200.
		if err := checkProbes(ctx, probesAddr); err != nil {
			child.Process.Kill()
			return err
		}
	}
	child.Process.Signal(syscall.SIGTERM)
	child.Wait()
	return nil
}

// replay replays the whole topic: it resets the group and consumes the
// topic again. It returns the ledger's rows before and after.
func (d *demo) replay(ctx context.Context) (before, after int, err error) {
	before = d.ledgerRows(ctx)
	if pol, err := entry("ledger", group); err != nil || !pol.Replay {
		return 0, 0, fmt.Errorf("the policy does not allow a replay of the ledger (%v); kscope replay would refuse it too", err)
	}
	if _, err := d.adm.DeleteGroup(ctx, group); err != nil {
		return 0, 0, fmt.Errorf("resetting the group: %w", err)
	}
	d.dltBeforeReplay = d.dltRecords(ctx)
	fmt.Println("  replaying the whole topic from the start")
	child, err := startConsumer(d.env)
	if err != nil {
		return 0, 0, err
	}
	if err := d.waitUntil(ctx, "replay", time.Minute, func() bool { return d.adm.caughtUp(ctx, group, topic) }); err != nil {
		child.Process.Kill()
		return 0, 0, err
	}
	child.Process.Signal(syscall.SIGTERM)
	child.Wait()
	return before, d.ledgerRows(ctx), nil
}

// killRelayOnce kills the outbox relay with SIGKILL once a third of the
// payments' events are published, and restarts it; once per run.
func (d *demo) killRelayOnce(ctx context.Context) {
	if d.relayKilled || published(ctx, d.pool) < len(d.s.valid)/3 {
		return
	}
	d.relayKilled = true
	d.relay.Process.Kill()
	d.relay.Wait()
	fmt.Println("  outbox relay killed with SIGKILL; restarting")
	var err error
	if d.relay, err = startConsumer(d.side("relay")); err != nil {
		fmt.Fprintln(os.Stderr, "restarting the relay:", err)
	}
}

// ledgerRows counts the ledger's rows.
func (d *demo) ledgerRows(ctx context.Context) int {
	var n int
	d.pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&n)
	return n
}

// notified counts the payment intents notified.
func (d *demo) notified(ctx context.Context) int {
	var n int
	d.pool.QueryRow(ctx, `SELECT count(DISTINCT intent) FROM notifications`).Scan(&n)
	return n
}

// progress prints where the run is: the ledger's rows, the group's lag,
// the retry backlog, the parked keys and the dead letters.
func (d *demo) progress(ctx context.Context, phase string) {
	adm := d.adm
	var lag int64
	ends, com := adm.endOffsets(ctx, topic), adm.committed(ctx, group, topic)
	for p, e := range ends {
		lag += e - com[p]
	}
	dl := d.dltRecords(ctx)
	// Records waiting in the retry topics, and keys held behind a
	// record that is in them: lag alone says 0 while they wait.
	var backlog int64
	fail, _ := failures() // checked at start
	for _, delay := range fail.Ladder {
		rt := retrytopic.RetryTopic(group, delay)
		ends, com := adm.endOffsets(ctx, rt), adm.committed(ctx, group, rt)
		for p, e := range ends {
			backlog += max(e-com[p], 0)
		}
	}
	var parked int
	d.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT topic, key FROM kscope_parked UNION SELECT topic, key FROM kscope_waiting) AS k`).Scan(&parked)
	fmt.Printf("  [%5.1fs] %-9s ledger rows %4d · lag %4d · retry backlog %3d · parked keys %2d · DLT records %d\n",
		time.Since(d.start).Seconds(), phase, d.ledgerRows(ctx), lag, backlog, parked, dl)
}

// dltRecords is the number of records in the ledger's DLT: the sum of its
// partitions' end offsets (its records are not produced in transactions).
func (d *demo) dltRecords(ctx context.Context) int64 {
	var n int64
	for _, e := range d.adm.endOffsets(ctx, retrytopic.DLTopic(group)) {
		n += e
	}
	return n
}

// waitUntil waits until cond holds, for at most limit, printing the
// progress every second, and kills the relay on the way (killRelayOnce).
func (d *demo) waitUntil(ctx context.Context, phase string, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	last := time.Time{}
	for !cond() {
		d.killRelayOnce(ctx)
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not done after %s", phase, limit)
		}
		if time.Since(last) > time.Second {
			d.progress(ctx, phase)
			last = time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.progress(ctx, phase)
	return nil
}

// outcome measures the run from the database, the topics and the gateway,
// and checks it; before and after are the ledger's rows around the replay.
func (d *demo) outcome(ctx context.Context, before, after int) (report, error) {
	rep, err := measure(ctx, d.kafka.Brokers, d.adm, d.pool, d.s)
	if err != nil {
		return rep, err
	}
	rep.ReplayNoopRate = 1 - float64(after-before)/float64(len(d.s.records))
	rep.DLTAddedByReplay = int(d.dltRecords(ctx) - d.dltBeforeReplay)
	rep.GatewayCharges, rep.GatewayChargesDuplicated, rep.GatewayReconciled = d.gw.counts()
	if err := measureNotifications(ctx, d.kafka.Brokers, d.adm, d.pool, d.gw, &rep); err != nil {
		return rep, err
	}
	rep.Seconds = float64(time.Since(d.start).Milliseconds()) / 1000
	rep.OK = invariantsHold(rep, d.s)
	return rep, nil
}

// invariantsHold reports whether the run kept every promise: each payment
// booked and charged once, poison dead-lettered, gaps healed, a replay
// that changes nothing, each booking published and notified once.
func invariantsHold(rep report, s stream) bool {
	// The inbox remembers a dead letter, so the replay routes nothing
	// again; only a kill between a DLT produce's acknowledgement and the
	// transaction that records it can double one, once per key-shard in
	// that window (the demo kills the ledger consumer once).
	return rep.Lost == 0 && rep.DuplicateEffects == 0 && rep.DeadLettered == s.poison &&
		rep.DLTAddedByReplay == 0 && rep.DLTRecords >= rep.DeadLettered && rep.DLTRecords-rep.DeadLettered <= ledgerShards &&
		rep.Effects == len(s.valid) && rep.ReplayNoopRate == 1 && rep.GapsHealed == rep.GapsDetected &&
		rep.GatewayChargesDuplicated == 0 && rep.GatewayCharges == rep.Effects-rep.Skipped &&
		rep.OutboxPublished == rep.Effects && rep.OutboxDuplicates == 0 && rep.OutboxLost == 0 &&
		rep.Notifications == rep.Effects && rep.NotificationDuplicates == 0
}

// printOutcome prints what the run shows, then the report as its last
// line, one JSON object.
func printOutcome(rep report) {
	fmt.Println()
	fmt.Printf("%d payment intents booked exactly once (%d declined, recorded as such), %d poison records dead-lettered\n",
		rep.Effects, rep.Skipped, rep.DeadLettered)
	fmt.Printf("(in %d DLT records, %d added by the replay; a kill between a DLT acknowledgement and its inbox row can double one per key-shard),\n",
		rep.DLTRecords, rep.DLTAddedByReplay)
	fmt.Printf("%d charges at the gateway, %d payment intents charged twice, %d reconciled after a crash instead of charged again,\n",
		rep.GatewayCharges, rep.GatewayChargesDuplicated, rep.GatewayReconciled)
	fmt.Printf("%d payment.booked events published through the outbox (%d read twice, %d missing), %d notifications sent (%d twice),\n",
		rep.OutboxPublished, rep.OutboxDuplicates, rep.OutboxLost, rep.Notifications, rep.NotificationDuplicates)
	fmt.Printf("%d intents retried, %d version gaps detected and %d healed, replay changed nothing (%.0f%% no-ops): %v\n",
		rep.Retried, rep.GapsDetected, rep.GapsHealed, rep.ReplayNoopRate*100, map[bool]string{true: "OK", false: "FAILED"}[rep.OK])
	line, _ := json.Marshal(rep)
	fmt.Println(string(line))
}
