package integration

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// tableApache names the report table of faults only a real cluster has.
const tableApache = "Apache Kafka"

// TestReliabilityApacheKafka kills Apache Kafka brokers under the DB scope
// and the Kafka scope while records flow: on a 3-node KRaft cluster
// (replication factor 3, min.insync.replicas=2) brokers one after another,
// the input partition's leader, the group coordinator's broker and, in the
// Kafka scope, the transaction coordinator's broker while a transaction is
// open; in the DB scope also the only broker of a 1-node cluster. Each
// killed broker is restarted. Each cluster is started from Apache Kafka's
// Maven Central artifacts (a JDK and Maven are needed). It runs in make
// test-kafka (KSCOPE_KAFKA=apache) and make reliability; make test, on
// kfake, leaves it out.
func TestReliabilityApacheKafka(t *testing.T) {
	kind, err := testenv.KafkaKind()
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case kind == "external" || kind == "container":
		t.Skipf("broker kills need brokers this process starts; the backend is %s", kind)
	case kind != "apache" && !reliabilityLong():
		t.Skipf("runs in make test-kafka (%s=apache) and make reliability", testenv.KafkaEnv)
	}
	// The scenarios on three nodes share one cluster, each with a topic
	// and a group of its own: every killed node is restarted and has
	// rejoined before its scenario ends.
	var three *testenv.Kafka
	for i, sc := range apacheScenarios() {
		if sc.apache == 3 {
			if three == nil {
				three = testenv.ApacheKafkaT(t, testenv.ApacheOptions{Nodes: 3})
			}
			sc.cluster, sc.name = three, strconv.Itoa(i)
		}
		t.Run(sc.scope+"/"+sc.fault, func(t *testing.T) {
			if sc.cluster != nil {
				restartStopped(t, sc.cluster.Apache) // a scenario that failed may have left a node down
			}
			runScenario(t, sc)
		})
	}
}

// restartStopped restarts the nodes of c that are not running.
func restartStopped(t *testing.T, c *testenv.ApacheCluster) {
	t.Helper()
	for _, id := range c.NodeIDs() {
		if c.Running(id) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := c.Restart(ctx, id)
		cancel()
		if err != nil {
			t.Fatalf("restarting node %d: %v\n%s", id, err, c.LogTail(id, 40))
		}
	}
}

func apacheScenarios() []relScenario {
	// A single broker's crash: the DB scope only. In the Kafka scope it
	// can lose a committed transaction, and no client can prevent it:
	// while the restarted broker has no partition leader yet, its
	// transaction coordinator completes the transactions it loads without
	// writing their markers to partitions that have no leader (it takes
	// them for deleted topics), and the producer's next abort then hides
	// those committed outputs from read_committed readers. docs/kafka-scope.md
	// (Replicated topics) says so: exactly-once needs replicated topics.
	out := []relScenario{{scope: "DB", fault: "broker SIGKILLed and restarted (1 node)", apache: 1, poison: 2,
		inject: killBrokers(func(e *relRun) (int32, error) { return 1, nil })}}
	for _, scope := range []string{"DB", "Kafka"} {
		out = append(out,
			relScenario{scope: scope, fault: "brokers SIGKILLed and restarted one after another (3 nodes)", apache: 3, poison: 2,
				inject: killBrokers(func(e *relRun) (int32, error) { return int32(e.kills.Load()%3) + 1, nil })},
			relScenario{scope: scope, fault: "partition leader SIGKILLed (3 nodes)", apache: 3, poison: 2,
				inject: killBrokers(func(e *relRun) (int32, error) { return e.k.Apache.Leader(context.Background(), e.topic, 0) })},
			relScenario{scope: scope, fault: "group coordinator's broker SIGKILLed (3 nodes)", apache: 3, poison: 2,
				inject: killBrokers(func(e *relRun) (int32, error) { return e.k.Apache.GroupCoordinator(context.Background(), e.group) })},
		)
	}
	// The DB scope uses no Kafka transaction: it has no transaction
	// coordinator to lose.
	out = append(out, relScenario{scope: "Kafka", fault: "transaction coordinator's broker SIGKILLed mid-transaction (3 nodes)", apache: 3, poison: 2,
		inject: killBrokers(func(e *relRun) (int32, error) {
			id := e.group + "-a"
			if err := e.waitOpenTransaction(id); err != nil {
				return 0, err
			}
			return e.k.Apache.TxnCoordinator(context.Background(), id)
		})})
	for i := range out {
		out[i].table = tableApache
		// Each record takes a little time, as real handlers do, so that the
		// stream outlasts the kills and restarts (seconds each).
		out[i].before = func(*relRun, context.Context, pgx.Tx, *consumer.Record, int32) error {
			time.Sleep(15 * time.Millisecond)
			return nil
		}
	}
	return out
}

// brokerKills is how many kills a scenario makes, while its stream lasts:
// three in the long form (make reliability), two in make test-kafka, where
// each kill and restart of a JVM broker costs CI a quarter of a minute.
func brokerKills() int {
	if reliabilityLong() {
		return 3
	}
	return 2
}

// killBrokers SIGKILLs the node pick names, several times while records
// flow. On a cluster of three the stream must go on while the node is
// down; then the node is restarted and rejoins before the next kill. A
// single node is restarted at once.
func killBrokers(pick func(e *relRun) (int32, error)) func(e *relRun) {
	return func(e *relRun) {
		e.t.Helper()
		c := e.k.Apache
		for i := range brokerKills() {
			// The first kill waits for the stream to be well under way;
			// the next ones come soon after the restart.
			if i == 0 {
				e.waitProgress(int64(e.total() / 8))
			} else {
				e.waitProgress(int64(e.total() / 40))
			}
			if e.progress() >= int64(e.total()) {
				break
			}
			id, err := pick(e)
			if errors.Is(err, errStreamDone) {
				break
			}
			if err != nil {
				e.t.Fatal(err)
			}
			if err := c.Kill(id); err != nil {
				e.t.Fatal(err)
			}
			e.kills.Add(1)
			if len(e.k.Brokers) >= 3 {
				e.waitProgress(int64(e.total() / 20))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			err = c.Restart(ctx, id)
			cancel()
			if err != nil {
				e.t.Fatalf("restarting node %d: %v\n%s", id, err, c.LogTail(id, 40))
			}
		}
	}
}

// errStreamDone ends a kill loop whose stream is done before the next kill.
var errStreamDone = errors.New("the stream is done")

// waitOpenTransaction waits until the transactional id has a transaction
// open (Ongoing) on its coordinator, so that a kill lands mid-transaction,
// or until the stream is done (errStreamDone).
func (e *relRun) waitOpenTransaction(txnID string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d, err := e.k.Admin().DescribeTransactions(ctx, txnID)
		cancel()
		if err == nil {
			if s, ok := d[txnID]; ok && s.Err == nil && s.State == "Ongoing" {
				return nil
			}
		}
		if e.progress() >= int64(e.total()) {
			return errStreamDone
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("transactional id %s had no open transaction for a minute", txnID)
}
