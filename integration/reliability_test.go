package integration

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/txn"
)

// The reliability suite runs DB-scope and Kafka-scope pipelines on a
// stream of known content while it injects faults on purpose, then checks
// the final state against the reference computed from the input: nothing
// lost, no effect (DB scope) or read_committed output (Kafka scope)
// doubled, each key's records applied in order. Every scenario adds a row
// to the report that TestMain prints as one JSON line at the end and, when
// reliabilityReportEnv names a file, writes as a Markdown table.
//
// The short form (the default, part of make test) runs every scenario on a
// small stream; KSCOPE_RELIABILITY=long (make reliability) runs them on a
// larger one with more kills and a longer soak.
const (
	reliabilityModeEnv   = "KSCOPE_RELIABILITY"
	reliabilityReportEnv = "KSCOPE_RELIABILITY_REPORT"
	reliabilityLogEnv    = "KSCOPE_RELIABILITY_LOG"
)

func reliabilityLong() bool { return os.Getenv(reliabilityModeEnv) == "long" }

// relSize is the stream of one scenario: keys × perKey keyed records.
func relSize() (keys, perKey int) {
	if reliabilityLong() {
		return relSizeLong()
	}
	return 16, 40
}

// relSizeLong is the stream of the long form.
func relSizeLong() (keys, perKey int) { return 40, 150 }

// relRow is one scenario's outcome.
type relRow struct {
	Scope    string        `json:"scope"`
	Fault    string        `json:"fault"`
	Records  int           `json:"records"`
	Faults   int64         `json:"faults_injected"`
	Kills    int64         `json:"kills"`
	Lost     int           `json:"lost"`
	Dups     int           `json:"duplicates"`
	Order    int           `json:"order_violations"`
	Duration time.Duration `json:"-"`
	Passed   bool          `json:"passed"`
	// Table is the report table the row belongs to: the fault matrix
	// (""), handler and operator faults (tableHandler) or Apache Kafka
	// broker kills (tableApache).
	Table string `json:"table,omitempty"`
	// Bound is the row's time bound (handler and operator faults): a
	// scenario that takes longer hung somewhere.
	Bound time.Duration `json:"-"`
	Hang  bool          `json:"hang,omitempty"`
	// Nodes is the size of the Apache Kafka cluster the row ran on (0:
	// the suite's backend).
	Nodes int `json:"nodes,omitempty"`
	// RetryPerFailed is, for ordered retries, the retry-topic records
	// written per record that failed into the retry topics.
	RetryPerFailed float64 `json:"retry_records_per_failed,omitempty"`
	// DupsAllowed says that the row's scope allows its duplicates (the
	// AtLeastOnce scope without an idempotency guard): they are reported,
	// not a failure, and not counted as duplicate effects.
	DupsAllowed bool `json:"duplicates_allowed,omitempty"`
	// Members, Partitions, Rebalances and Stall are the rolling-deploy
	// table's (tableRoll): the member processes, the input's partitions,
	// the changes of the group's membership seen, and the longest time a
	// partition with records to consume made no progress.
	Members    int           `json:"members,omitempty"`
	Partitions int32         `json:"partitions,omitempty"`
	Rebalances int           `json:"rebalances,omitempty"`
	Stall      time.Duration `json:"-"`
}

// tableHandler names the report table of handler and operator faults.
const tableHandler = "handler and operator faults"

var relReport struct {
	mu   sync.Mutex
	rows []relRow
}

func addRelRow(r relRow) {
	relReport.mu.Lock()
	relReport.rows = append(relReport.rows, r)
	relReport.mu.Unlock()
}

// relSummary is the JSON line the suite ends with.
type relSummary struct {
	Scenarios   int   `json:"scenarios"`
	Faults      int64 `json:"faults_injected"`
	Kills       int64 `json:"kills"`
	Records     int   `json:"records"`
	Lost        int   `json:"lost"`
	DupEffects  int   `json:"duplicate_effects"`
	DupOutputs  int   `json:"duplicate_outputs"`
	OrderBroken int   `json:"order_violations"`
	Failed      int   `json:"failed_scenarios"`
	// HandlerFaults counts the rows of the handler and operator faults
	// table; Hangs those that missed their time bound.
	HandlerFaults int `json:"handler_faults"`
	Hangs         int `json:"hangs"`
	// ApacheKafka counts the rows of the Apache Kafka table, and
	// ApacheNodes is the largest cluster they ran on.
	ApacheKafka int `json:"apache_kafka"`
	ApacheNodes int `json:"apache_kafka_nodes,omitempty"`
	// RetryPerFailed is the most retry-topic records a failed record
	// caused in the ordered-retries scenario (bound: the ladder plus one).
	RetryPerFailed float64 `json:"retry_records_per_failed"`
	// DupAllowed counts the duplicates of rows whose scope allows them
	// (the AtLeastOnce scope's share-group row).
	DupAllowed int `json:"duplicates_allowed,omitempty"`
}

// finishReliability prints the JSON line and writes the Markdown report,
// when any scenario ran. It is called by TestMain after the tests.
func finishReliability() error {
	relReport.mu.Lock()
	rows := append([]relRow(nil), relReport.rows...)
	relReport.mu.Unlock()
	if len(rows) == 0 {
		return nil
	}
	var s relSummary
	for _, r := range rows {
		s.Scenarios++
		s.Faults += r.Faults
		s.Kills += r.Kills
		s.Records += r.Records
		s.Lost += r.Lost
		s.OrderBroken += r.Order
		switch {
		case r.DupsAllowed:
			s.DupAllowed += r.Dups
		case r.Scope == "Kafka":
			s.DupOutputs += r.Dups
		default:
			s.DupEffects += r.Dups
		}
		if !r.Passed {
			s.Failed++
		}
		switch r.Table {
		case tableHandler:
			s.HandlerFaults++
		case tableApache:
			s.ApacheKafka++
			s.ApacheNodes = max(s.ApacheNodes, r.Nodes)
		}
		if r.Hang {
			s.Hangs++
		}
		s.RetryPerFailed = max(s.RetryPerFailed, r.RetryPerFailed)
	}
	line, _ := json.Marshal(s)
	fmt.Println(string(line))
	path := os.Getenv(reliabilityReportEnv)
	if path == "" {
		return nil
	}
	return os.WriteFile(path, []byte(reliabilityMarkdown(rows, string(line))), 0o644)
}

func reliabilityMarkdown(rows []relRow, line string) string {
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Scope < rows[j].Scope })
	mode := "short"
	if reliabilityLong() {
		mode = "long"
	}
	var b strings.Builder
	b.WriteString("# Reliability\n\n")
	b.WriteString("Produced by `make reliability` (the " + mode + " form of the suites in\n")
	b.WriteString("`integration/reliability*_test.go` and `integration/security_test.go`;\n")
	b.WriteString("`make test` runs their short form).\n")
	b.WriteString("Each scenario runs a pipeline on a stream of known keyed records while the\n")
	b.WriteString("fault is injected, then checks the final state against the reference\n")
	b.WriteString("computed from the input: records lost, duplicate effects (DB scope: rows\n")
	b.WriteString("in PostgreSQL) or duplicate outputs (Kafka scope: records a\n")
	b.WriteString("read_committed reader sees), and per-key order violations. Poison\n")
	b.WriteString("records count as lost unless they reach the dead-letter topic.\n\n")
	b.WriteString("## Fault matrix\n\n")
	b.WriteString("| scope | fault | records | faults injected | kills | lost | duplicates | order violations | time | result |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range rows {
		if r.Table != "" {
			continue
		}
		res := "pass"
		if !r.Passed {
			res = "FAIL"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d | %.1fs | %s |\n",
			r.Scope, r.Fault, r.Records, r.Faults, r.Kills, r.Lost, r.Dups, r.Order, r.Duration.Seconds(), res)
	}
	b.WriteString("\n## Handler and operator faults\n\n")
	b.WriteString("What handlers return and operators change every day, with the same\n")
	b.WriteString("checks, and a time bound per row: a row over its bound is a hang\n")
	b.WriteString("(`TestReliabilityHandlerFaults`).\n\n")
	b.WriteString("| scope | fault | records | faults injected | kills | lost | duplicates | order violations | time | bound | result |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range rows {
		if r.Table != tableHandler {
			continue
		}
		res := "pass"
		switch {
		case r.Hang:
			res = "HANG"
		case !r.Passed:
			res = "FAIL"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d | %.1fs | %.0fs | %s |\n",
			r.Scope, r.Fault, r.Records, r.Faults, r.Kills, r.Lost, r.Dups, r.Order, r.Duration.Seconds(), r.Bound.Seconds(), res)
	}
	b.WriteString("\n## Apache Kafka\n\n")
	b.WriteString("Faults only a real cluster has (`TestReliabilityApacheKafka`), on Apache Kafka\n")
	b.WriteString(testenv.ApacheKafkaVersion + " started from its Maven Central artifacts: brokers SIGKILLed\n")
	b.WriteString("while records flow and restarted. On 3 nodes (KRaft, each broker and\n")
	b.WriteString("controller; replication factor 3, min.insync.replicas=2) the stream goes on\n")
	b.WriteString("while the node is down. The transaction coordinator's broker is killed\n")
	b.WriteString("while the member's transaction is Ongoing; the DB scope uses no Kafka\n")
	b.WriteString("transaction, so that row is the Kafka scope's only. Kills are broker kills.\n")
	b.WriteString("The crash of a 1-node cluster runs under the DB scope only: there Apache\n")
	b.WriteString("Kafka itself can lose a committed transaction (its restarted coordinator\n")
	b.WriteString("completes the transactions it loads without writing markers to partitions\n")
	b.WriteString("that have no leader yet), which no client can prevent; see \"Replicated topics\"\n")
	b.WriteString("in docs/kafka-scope.md.\n\n")
	b.WriteString("| scope | fault | records | kills | lost | duplicates | order violations | time | result |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range rows {
		if r.Table != tableApache {
			continue
		}
		res := "pass"
		if !r.Passed {
			res = "FAIL"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %.1fs | %s |\n",
			r.Scope, r.Fault, r.Records, r.Kills, r.Lost, r.Dups, r.Order, r.Duration.Seconds(), res)
	}
	writeRollTable(&b, rows)
	b.WriteString("\nThe same run also checks, each as a test that fails it when broken:\n")
	b.WriteString("TLS with SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 to Kafka, and a wrong\n")
	b.WriteString("password ending Run with an error (TestReliabilityTLSAndSASL); PostgreSQL\n")
	b.WriteString("over verified TLS (TestReliabilityPostgresTLS); no password, connection\n")
	b.WriteString("string secret or record payload in the logs or dead-letter headers\n")
	b.WriteString("(TestReliabilityTLSAndSASL, TestReliabilitySecretsStayOutOfLogs). Fuzz\n")
	b.WriteString("targets for every header decoder and option struct run with `go test -fuzz`\n")
	b.WriteString("(their seed corpora under `*/testdata/fuzz/` run in `make test`).\n")
	b.WriteString("\nSummary:\n\n```json\n" + line + "\n```\n")
	return b.String()
}

// relScenario is one row of the fault matrix.
type relScenario struct {
	scope   string // "DB" or "Kafka"
	fault   string // what is injected, as the report shows it
	poison  int    // poison records added to the stream (they must reach the DLT)
	brokers int    // kfake brokers; default 3
	// apache runs the scenario on an Apache Kafka cluster of that many
	// nodes, started for it whatever the backend (its inject kills
	// brokers), or on cluster when that is set: a cluster of that many
	// nodes that scenarios run on one after another, each with a topic
	// and a group of its own (name).
	apache  int
	cluster *testenv.Kafka
	name    string
	// partitions of the input topic (default 4); keys and perKey, when
	// set, size the stream instead of relSize.
	partitions   int32
	keys, perKey int
	// broker marks a fault injected into the in-process kfake cluster: it
	// is skipped on external brokers and containers.
	broker bool
	// children runs the pipeline as child processes (inject starts and
	// stops them) instead of one in-process member.
	children bool
	cfg      func(*consumer.Config)
	pool     func(*pgxpool.Config)
	// before runs in the handler before the record's effect; an error
	// fails the attempt.
	before func(e *relRun, ctx context.Context, tx pgx.Tx, r *consumer.Record, attempt int32) error
	// inject injects the fault while records flow and returns once it has.
	inject func(e *relRun)

	// table is the report table ("" for the fault matrix); bound the
	// scenario's time bound, past which it counts as a hang.
	table string
	bound time.Duration
	// manual leaves starting the members to inject; noTopic also leaves
	// creating the input topic and producing the first half of the stream
	// to it (e.createInput).
	manual, noTopic bool
	// row, when set, adds the scenario's own columns to its row.
	row func(*relRow)
	// setup runs once the topics exist, before the stream is produced.
	setup func(e *relRun)
	// noMigrate leaves the DB scope's schema to inject.
	noMigrate bool
	// poisonErr is the error poison record i's handler returns (default:
	// a DecodeError).
	poisonErr func(i int) error
	// noOutput leaves creating the Kafka scope's output topic to inject.
	noOutput bool
	// skips adds records ("skip-<i>") whose DB-scope handler runs a
	// failing statement and then returns a business Skip: they must be
	// acknowledged without an effect, and without holding anything up.
	skips int
}

// relRun is a running scenario.
type relRun struct {
	t            *testing.T
	sc           relScenario
	k            *testenv.Kafka
	topic, group string
	keys, perKey int
	pool         *pgxpool.Pool
	dbURL        string
	faults       atomic.Int64
	kills        atomic.Int64
	members      []*relMember
	attempts     sync.Map // record value -> *atomic.Int32, attempts seen by in-process handlers
	recs         []*kgo.Record
	half         int
	logs         testenv.LogBuffer // what in-process members log, at Warn and above
}

func (e *relRun) total() int { return e.keys * e.perKey }

// attempt counts an in-process handler call for r and returns its number.
func (e *relRun) attempt(r *consumer.Record) int32 {
	c, _ := e.attempts.LoadOrStore(string(r.Value), new(atomic.Int32))
	return c.(*atomic.Int32).Add(1)
}

// progress is how many records are done: applied (DB scope) or committed
// (Kafka scope).
func (e *relRun) progress() int64 {
	if e.sc.scope == "DB" {
		var n int64
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.pool.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM effects`).Scan(&n); err != nil {
			return 0 // the server may be restarting
		}
		return n
	}
	return committedSumQuiet(e.k, e.group, e.topic)
}

// waitProgress waits until n more records are done than when called (or
// the stream is done).
func (e *relRun) waitProgress(n int64) {
	e.t.Helper()
	target := min(e.progress()+n, int64(e.total()))
	testenv.WaitFor(e.t, 2*time.Minute, fmt.Sprintf("%d records done", target), func() bool {
		e.check()
		return e.progress() >= target
	})
}

// relLogger discards the runners' logs unless KSCOPE_RELIABILITY_LOG is
// set (to "kgo" for the Kafka client's log too): the faults make them
// noisy on purpose.
func relLogger() *slog.Logger {
	if os.Getenv(reliabilityLogEnv) != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.DiscardHandler)
}

// createInput creates the input topic and produces the first half of the
// stream to it, for a scenario that leaves that to inject (noTopic).
func (e *relRun) createInput() {
	e.t.Helper()
	if err := e.k.CreateTopic(context.Background(), e.topic, 4); err != nil {
		e.t.Fatal(err)
	}
	if err := e.k.Produce(context.Background(), e.recs[:e.half]...); err != nil {
		e.t.Fatal(err)
	}
}

func (e *relRun) config(name string) consumer.Config {
	cfg := consumer.Config{
		Brokers:          e.k.Brokers,
		Group:            e.group,
		Topics:           []string{e.topic},
		Shards:           4,
		CommitInterval:   50 * time.Millisecond,
		DrainTimeout:     5 * time.Second,
		RebalanceTimeout: 20 * time.Second,
		ClientOptions:    append(childClientOptions(), kgo.ClientID(name)),
		Logger:           relLogger(),
		Failures: retrytopic.Policy{
			Backoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
			InPlaceAttempts: 2, Ladder: []time.Duration{200 * time.Millisecond},
		},
	}
	if os.Getenv(reliabilityLogEnv) == "kgo" {
		// The client's own log, for a scenario that stalls.
		cfg.ClientOptions = append(cfg.ClientOptions, kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelInfo, func() string {
			return name + " " + time.Now().Format("15:04:05.000") + " "
		})))
	}
	if e.sc.cfg != nil {
		e.sc.cfg(&cfg)
	}
	if e.sc.table == tableHandler {
		cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&e.logs, relLogWriter()), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return cfg
}

// relLogWriter is where scenario logs go besides e.logs: stderr when
// KSCOPE_RELIABILITY_LOG is set.
func relLogWriter() io.Writer {
	if os.Getenv(reliabilityLogEnv) != "" {
		return os.Stderr
	}
	return io.Discard
}

// relMember is one in-process member or child process of a scenario.
type relMember struct {
	name   string
	stop   context.CancelFunc
	done   chan struct{} // closed when Run returned
	runErr error
	child  *child
}

// check fails the test at once when an in-process member's Run returned
// before the test stopped it.
func (e *relRun) check() {
	e.t.Helper()
	for _, m := range e.members {
		if m.child != nil || m.stop == nil {
			continue
		}
		select {
		case <-m.done:
			e.t.Fatalf("member %s: Run returned while records flowed: %v", m.name, m.runErr)
		default:
		}
	}
}

// start starts an in-process member.
func (e *relRun) start(name string) *relMember {
	e.t.Helper()
	return e.startWith(name, nil)
}

// startWith starts an in-process member whose configuration edit changes
// (a new deployment's, say).
func (e *relRun) startWith(name string, edit func(*consumer.Config)) *relMember {
	e.t.Helper()
	cfg := e.config(name)
	if edit != nil {
		edit(&cfg)
	}
	var run func(context.Context) error
	switch e.sc.scope {
	case "DB":
		r, err := dbscope.New(cfg, dbscope.Options{Pool: e.pool}, dbscope.HandlerFunc(
			func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
				n := e.attempt(r)
				if strings.HasPrefix(string(r.Value), "poison-") {
					return e.poison(r)
				}
				if strings.HasPrefix(string(r.Value), "skip-") {
					_, err := tx.Exec(ctx, `SELECT 1/0`)
					return consumer.Skip(fmt.Errorf("declined after a failed statement: %w", err))
				}
				if e.sc.before != nil {
					if err := e.sc.before(e, ctx, tx, r, n); errors.Is(err, errSkipEffect) {
						return nil // a handler that ignored its failed statement
					} else if err != nil {
						return err
					}
				}
				key, seq, _ := testenv.ParseKeyed(r.Value)
				// A handler that outlived its context still writes: a
				// zombie, which the inbox must make harmless.
				_, err := tx.Exec(context.WithoutCancel(ctx), `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`,
					consumer.Identity{}.Of(r), key, seq)
				return err
			}))
		if err != nil {
			e.t.Fatal(err)
		}
		run = r.Run
	case "Kafka":
		out := e.topic + ".out"
		r, err := txn.New(cfg, txn.Options{TransactionalID: e.group + "-" + name, CommitInterval: 50 * time.Millisecond},
			txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, em txn.Emitter) error {
				n := e.attempt(r)
				if strings.HasPrefix(string(r.Value), "poison-") {
					return e.poison(r)
				}
				if e.sc.before != nil {
					if err := e.sc.before(e, ctx, nil, r, n); err != nil {
						return err
					}
				}
				for _, s := range []string{"a", "b"} {
					em.Emit(&kgo.Record{Topic: out, Key: r.Key, Value: []byte(string(r.Value) + "#" + s)})
				}
				return nil
			}))
		if err != nil {
			e.t.Fatal(err)
		}
		run = r.Run
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &relMember{name: name, stop: cancel, done: make(chan struct{})}
	go func() {
		m.runErr = run(ctx)
		close(m.done)
	}()
	e.members = append(e.members, m)
	return m
}

// poison is the error a poison record's handler returns.
func (e *relRun) poison(r *consumer.Record) error {
	if e.sc.poisonErr != nil {
		i, _ := strconv.Atoi(strings.TrimPrefix(string(r.Value), "poison-"))
		return e.sc.poisonErr(i)
	}
	return consumer.DecodeError(fmt.Errorf("record is not a keyed test record"))
}

// startChild starts a child-process member; it is killed at the end of the
// test if still running.
func (e *relRun) startChild() *relMember {
	e.t.Helper()
	role := "db"
	var env []string
	if e.sc.scope == "Kafka" {
		role = "txn"
	} else {
		env = append(env, e.dbURL)
	}
	c := startChild(e.t, e.k, role, e.group, e.topic, 200*time.Microsecond, func([]byte) {}, env...)
	m := &relMember{name: "child", child: c}
	e.members = append(e.members, m)
	return m
}

// leave stops an in-process member gracefully, or a child with SIGTERM,
// and reports how Run ended.
func (m *relMember) leave(t *testing.T) error {
	t.Helper()
	if m.child != nil {
		select {
		case <-m.child.exited:
			return nil // killed earlier
		default:
		}
		return m.child.terminate(t)
	}
	if m.stop == nil {
		return nil
	}
	m.stop()
	m.stop = nil
	select {
	case <-m.done:
		return m.runErr
	case <-time.After(time.Minute):
		return fmt.Errorf("member %s did not stop within a minute of its cancel", m.name)
	}
}

// runScenario runs sc and records its row; it fails t when anything was
// lost, doubled or reordered.
func runScenario(t *testing.T, sc relScenario) {
	start := time.Now()
	keys, perKey := relSize()
	if sc.apache > 0 {
		// A cluster's start and its brokers' restarts take seconds: the
		// long stream keeps records flowing through every kill.
		keys, perKey = relSizeLong()
	}
	if sc.keys > 0 {
		keys, perKey = sc.keys, sc.perKey
	}
	partitions := cmp.Or(sc.partitions, 4)
	brokers := sc.brokers
	if brokers == 0 {
		brokers = 3
	}
	if kind, err := testenv.KafkaKind(); err != nil {
		t.Fatal(err)
	} else if sc.broker && kind != "kfake" {
		t.Skipf("broker faults need the in-process kfake cluster, this backend is %s", kind)
	}
	e := &relRun{t: t, sc: sc, keys: keys, perKey: perKey, topic: "rel-in", group: "g-rel"}
	if sc.name != "" {
		e.topic, e.group = e.topic+"-"+sc.name, e.group+"-"+sc.name
	}
	switch {
	case sc.cluster != nil:
		e.k = sc.cluster
	case sc.apache > 0:
		e.k = testenv.ApacheKafkaT(t, testenv.ApacheOptions{Nodes: sc.apache})
	default:
		e.k = testenv.KafkaT(t, kfake.NumBrokers(brokers), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	}
	ctx := context.Background()
	var topics []string
	if !sc.noTopic {
		topics = append(topics, e.topic)
	}
	if sc.scope == "Kafka" && !sc.noOutput {
		topics = append(topics, e.topic+".out")
	}
	for _, tp := range topics {
		if err := e.k.CreateTopic(ctx, tp, partitions); err != nil {
			t.Fatal(err)
		}
	}
	if sc.scope == "DB" {
		url := testenv.DatabaseT(t)
		pc, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		if sc.pool != nil {
			sc.pool(pc)
		}
		e.pool, err = pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.pool.Close)
		if !sc.noMigrate {
			if err := dbscope.Migrate(ctx, e.pool, ""); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := e.pool.Exec(ctx, effectsDDL); err != nil {
			t.Fatal(err)
		}
		e.dbURL = "DATABASE_URL=" + url
	}

	// Half the stream is there from the start; the rest is produced while
	// the fault is injected, kept ahead of what is done.
	recs := testenv.KeyedRecords(e.topic, keys, perKey)
	for i := range sc.poison {
		recs = append(recs, &kgo.Record{Topic: e.topic, Key: []byte(fmt.Sprintf("p%03d", i)), Value: []byte(fmt.Sprintf("poison-%d", i))})
	}
	for i := range sc.skips {
		recs = append(recs, &kgo.Record{Topic: e.topic, Key: []byte(fmt.Sprintf("s%03d", i)), Value: []byte(fmt.Sprintf("skip-%d", i))})
	}
	half := (perKey / 2) * keys
	e.recs, e.half = recs, half
	if sc.setup != nil {
		sc.setup(e)
		recs = e.recs
	}
	if !sc.noTopic {
		if err := e.k.Produce(ctx, recs[:half]...); err != nil {
			t.Fatal(err)
		}
	}
	produced := make(chan error, 1)
	go func() {
		rest := recs[half:]
		chunk := 4 * keys
		for len(rest) > 0 {
			deadline := time.Now().Add(2 * time.Minute)
			for e.progress() < int64(len(recs)-len(rest)-half/2) {
				if time.Now().After(deadline) {
					produced <- fmt.Errorf("the consumers made no progress for 2 minutes")
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
			n := min(chunk, len(rest))
			if err := e.k.Produce(ctx, rest[:n]...); err != nil {
				produced <- err
				return
			}
			rest = rest[n:]
		}
		produced <- nil
	}()

	if !sc.children && !sc.manual && !sc.noTopic {
		e.start("a")
	}
	sc.inject(e)
	e.check()
	if sc.children {
		e.startChild() // the survivor, which finishes the stream
	}
	if err := <-produced; err != nil {
		e.check()
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "every record done and committed", func() bool {
		e.check()
		return e.progress() >= int64(e.total()) && e.k.CaughtUp(ctx, e.group, e.topic) && e.dltAtLeast(sc.poison)
	})
	for _, m := range e.members {
		if err := m.leave(t); err != nil {
			t.Errorf("member %s: Run returned %v", m.name, err)
		}
	}

	row := relRow{Scope: sc.scope, Fault: sc.fault, Records: e.total() + sc.poison + sc.skips,
		Faults: e.faults.Load() + int64(sc.skips), Kills: e.kills.Load(), Table: sc.table, Bound: sc.bound, Nodes: sc.apache, Partitions: partitions}
	if sc.row != nil {
		sc.row(&row)
	}
	if sc.scope == "DB" {
		row.Lost, row.Dups, row.Order = e.checkDB()
	} else {
		row.Lost, row.Dups, row.Order = e.checkKafka()
	}
	if sc.poison > 0 {
		lost, dups := e.checkDLT()
		row.Lost += lost
		if sc.scope == "Kafka" {
			row.Dups += dups // the DLT record is produced in the transaction
		}
	}
	row.Duration = time.Since(start)
	row.Hang = sc.bound > 0 && row.Duration > sc.bound
	row.Passed = row.Lost == 0 && row.Dups == 0 && row.Order == 0 && !row.Hang && !t.Failed()
	addRelRow(row)
	if row.Faults+row.Kills == 0 {
		t.Errorf("no fault was injected: the scenario tested nothing")
	}
	if !row.Passed {
		t.Errorf("%s / %s: %d lost, %d duplicates, %d order violations", sc.scope, sc.fault, row.Lost, row.Dups, row.Order)
	}
	if row.Hang {
		t.Errorf("%s / %s took %s, over its bound of %s", sc.scope, sc.fault, row.Duration.Round(time.Millisecond), sc.bound)
	}
	t.Logf("%s / %s: %d records, %d faults, %d kills in %s", sc.scope, sc.fault, row.Records, row.Faults, row.Kills, row.Duration.Round(time.Millisecond))
}

// tally compares, per key, the sequence numbers seen (in the order they
// were applied or read) with 0..perKey-1 exactly once, in order.
func (e *relRun) tally(seen map[string][]int) (lost, dups, order int) {
	for i := range e.keys {
		key := fmt.Sprintf("k%03d", i)
		s := seen[key]
		got := make(map[int]int, len(s))
		prev := -1
		for _, v := range s {
			got[v]++
			if got[v] > 1 {
				dups++
				continue
			}
			if v < prev {
				order++
			}
			prev = v
		}
		for v := range e.perKey {
			if got[v] == 0 {
				lost++
			}
		}
	}
	return lost, dups, order
}

func (e *relRun) checkDB() (lost, dups, order int) {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT key, seq FROM effects ORDER BY n`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	seen := map[string][]int{}
	for rows.Next() {
		var key string
		var seq int
		if err := rows.Scan(&key, &seq); err != nil {
			e.t.Fatal(err)
		}
		seen[key] = append(seen[key], seq)
	}
	return e.tally(seen)
}

// checkKafka reads the outputs read_committed: each input has an "#a" and
// a "#b" output, each must be seen once, in key order per output kind.
func (e *relRun) checkKafka() (lost, dups, order int) {
	e.t.Helper()
	byKind := map[string]map[string][]int{"a": {}, "b": {}}
	for _, r := range e.k.ReadAll(e.t, e.topic+".out") {
		v, kind, ok := strings.Cut(string(r.Value), "#")
		key, seq, ok2 := testenv.ParseKeyed([]byte(v))
		if !ok || !ok2 || byKind[kind] == nil {
			e.t.Errorf("unexpected output %q", r.Value)
			continue
		}
		byKind[kind][key] = append(byKind[kind][key], seq)
	}
	for _, seen := range byKind {
		l, d, o := e.tally(seen)
		lost, dups, order = lost+l, dups+d, order+o
	}
	return lost, dups, order
}

// dltAtLeast reports whether the dead-letter topic holds at least n
// records (or markers: the check that follows reads them).
func (e *relRun) dltAtLeast(n int) bool {
	if n == 0 {
		return true
	}
	ends, err := e.k.EndOffsets(context.Background(), retrytopic.DLTopic(e.group))
	if err != nil {
		return false
	}
	var sum int64
	for _, o := range ends {
		sum += o
	}
	return sum >= int64(n)
}

// checkDLT counts the poison records missing from the dead-letter topic and
// those seen there more than once.
func (e *relRun) checkDLT() (lost, dups int) {
	e.t.Helper()
	seen := map[string]int{}
	for _, r := range e.k.ReadAll(e.t, retrytopic.DLTopic(e.group)) {
		seen[string(r.Value)]++
	}
	for i := range e.sc.poison {
		switch n := seen[fmt.Sprintf("poison-%d", i)]; {
		case n == 0:
			lost++
		case n > 1:
			dups += n - 1
		}
	}
	return lost, dups
}
