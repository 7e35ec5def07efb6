package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// pcDir holds the Parallel Consumer harness: a Maven project whose single
// class runs the r4 workload (KEY ordering, 64-way concurrency, a 5 ms
// sleep per record) and prints {"records":N,"seconds":S,"handler_ms":M}.
const pcDir = "pc"

// errNoJVM says that the machine lacks the JDK or Maven the peer needs.
var errNoJVM = errors.New("java or mvn not found on PATH")

// buildPC builds the harness once (Maven resolves Parallel Consumer and its
// dependencies from Maven Central into the local repository) and returns
// its class path.
func buildPC(ctx context.Context) (string, error) {
	for _, tool := range []string{"java", "mvn"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", errNoJVM
		}
	}
	cmd := exec.CommandContext(ctx, "mvn", "-q", "-B", "package", "-DskipTests")
	cmd.Dir = pcDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the Parallel Consumer harness: %w\n%s", err, out)
	}
	abs, err := filepath.Abs(pcDir)
	if err != nil {
		return "", err
	}
	return filepath.Join(abs, "target", "pc-bench-1.jar") + string(os.PathListSeparator) + filepath.Join(abs, "target", "lib", "*"), nil
}

// parallelConsumer runs the harness as a contender on b's broker and topic.
func (b *bench) parallelConsumer(classpath string) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) {
		ctx, cancel := context.WithTimeout(ctx, runTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "java", "-cp", classpath, "dev.kscope.bench.PcBench",
			strings.Join(b.k.Brokers, ","), b.topic, b.name("pc"), fmt.Sprint(n), "64", fmt.Sprint(ioDelay.Milliseconds()))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return result{}, fmt.Errorf("the Parallel Consumer harness: %w: %s", err, stderr.String())
		}
		var got struct {
			Records   int     `json:"records"`
			Seconds   float64 `json:"seconds"`
			HandlerMs float64 `json:"handler_ms"`
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
			return result{}, fmt.Errorf("the Parallel Consumer harness printed %q: %w", out, err)
		}
		return result{
			records: got.Records,
			elapsed: time.Duration(got.Seconds * float64(time.Second)),
			handler: time.Duration(got.HandlerMs * float64(time.Millisecond)),
		}, nil
	}
}

// apache runs, against an Apache Kafka broker (b's own when the run uses
// one, else one started here), the peers (Parallel Consumer on the r4
// workload only when the plan is untargeted or -only names pc) and
// share_vs_group and, when the run's own figures are kfake's, r1, r3
// against the naive loop and r5 again, reported beside them with the
// suffix _apache.
func (b *bench) apache(ctx context.Context, p plan, rep *report, n int) error {
	cp, err := buildPC(ctx)
	if errors.Is(err, errNoJVM) {
		b.logf("Apache Kafka and the Parallel Consumer peer: skipped (%v)", err)
		return nil
	}
	if err != nil {
		return err
	}
	ab := b
	if b.k.Kind == "kfake" {
		b.logf("Apache Kafka: starting %s", testenv.ApacheKafkaVersion)
		k, err := testenv.StartApacheKafka(ctx, testenv.ApacheOptions{})
		if err != nil {
			return fmt.Errorf("starting Apache Kafka: %w", err)
		}
		defer k.Close()
		ab = &bench{k: k, pg: b.pg, pool: b.pool, runs: b.runs, log: b.log, out: b.out, topic: "bench.records.apache"}
		backlog := max(n*2, p.apacheNoop)
		b.logf("Apache Kafka: producing %d records", backlog)
		if err := ab.produceBacklog(ctx, ab.topic, backlog); err != nil {
			return err
		}
	}
	untargeted := p.untargeted || p.only["pc"]
	if untargeted {
		if err := ab.pcPeer(ctx, p, rep, cp, n); err != nil {
			return err
		}
	}
	if err := ab.shareVsGroup(ctx, rep, p); err != nil {
		return err
	}
	if err := ab.kstreamsPeers(ctx, p, rep); err != nil {
		return err
	}
	if err := ab.pcEOSPeer(ctx, p, rep); err != nil {
		return err
	}
	if ab == b {
		return nil // the run's own figures are Apache Kafka's
	}
	if err := ab.r1Apache(ctx, p, rep); err != nil {
		return err
	}
	return ab.apacheAgain(ctx, p, rep, untargeted)
}

// apacheAgain measures r3 against the naive loop and r5 on Apache Kafka
// (r3_db_vs_naive_apache, r5_txn_vs_alo_apache) and, when untargeted,
// the guard's cost there (r5_dedupe_cost_apache).
func (ab *bench) apacheAgain(ctx context.Context, p plan, rep *report, untargeted bool) error {
	figs, err := ab.measure(ctx, "r3 DB scope (Apache Kafka)",
		contender{"kscope DB scope, queued handler (Apache Kafka)", p.db, ab.kscopeDBQueued(0), ab.resetDB},
		contender{"naive loop: a transaction and a sync offset commit per record (Apache Kafka)", p.naive, ab.naiveDB, ab.resetDB})
	if err != nil {
		return err
	}
	rep.add(scenario{key: "r3_db_vs_naive_apache", title: "r3 against the naive loop on Apache Kafka", figs: figs,
		pair: pairOf(figs[0], figs[1]), target: 10, atLeast: true})
	if figs, err = ab.measureWarm(ctx, "r5 Kafka scope (Apache Kafka)", 2, ab.runs+p.r5ApacheExtra,
		contender{"kscope Kafka scope (txn), one output per input (Apache Kafka)", p.apacheTxn, ab.txnEmit, nil},
		contender{"kscope AtLeastOnce, handler producing synchronously (Apache Kafka)", p.apacheAlo, ab.aloProduce, nil}); err != nil {
		return err
	}
	rep.add(scenario{key: "r5_txn_vs_alo_apache", title: "r5 on Apache Kafka", figs: figs,
		pair: pairOf(figs[0], figs[1]), target: 0.7, atLeast: true})
	if !untargeted {
		return nil
	}
	// The guard's cost where the broker is another process: the
	// scope's own work per input is then the client's and kscope's alone.
	if figs, err = ab.measureWarm(ctx, "r5 dedupe cost (Apache Kafka)", 2, ab.runs+p.r5ApacheExtra,
		contender{"kscope Kafka scope with the idempotency guard (Apache Kafka)", p.apacheTxn, ab.txnEmitWith(&txn.DedupeOptions{}), nil},
		contender{"the same scope without it (Apache Kafka)", p.apacheTxn, ab.txnEmitWith(nil), nil}); err != nil {
		return err
	}
	rep.add(scenario{key: "r5_dedupe_cost_apache", title: "r5: the idempotency guard's cost on Apache Kafka", figs: figs,
		pair: pairOf(figs[0], figs[1]), atLeast: true, noTarget: true, cpu: true})
	return nil
}

// pcPeer measures the r4 workload on kscope and on Confluent Parallel
// Consumer (peer_parallel_consumer).
func (ab *bench) pcPeer(ctx context.Context, p plan, rep *report, cp string, n int) error {
	pcRuns := ab.runs
	if p.pcRuns > 0 {
		pcRuns = min(pcRuns, p.pcRuns)
	}
	figs, err := ab.measureWarm(ctx, "peer Parallel Consumer (Apache Kafka)", 5, pcRuns,
		contender{"kscope AtLeastOnce, 5 ms handler, 64 key-shards (Apache Kafka)", n, ab.kscopeIO(64), nil},
		contender{"Confluent Parallel Consumer 0.5.3.3, KEY order, concurrency 64, 5 ms handler (Apache Kafka)", n, ab.parallelConsumer(cp), nil})
	if err != nil {
		return err
	}
	rep.add(scenario{key: "peer_parallel_consumer", title: "Peer: kscope against Confluent Parallel Consumer (r4 workload, Apache Kafka)", figs: figs,
		pair: pairOf(figs[0], figs[1]), atLeast: true, noTarget: true})
	return nil
}

// r1Apache measures r1 on Apache Kafka (r1_noop_apache) and, from the same
// rounds, cpu_per_record.
func (ab *bench) r1Apache(ctx context.Context, p plan, rep *report) error {
	figs, err := ab.measureWarm(ctx, "r1 no-op (Apache Kafka)", 1, ab.runs+r1ApacheExtraRuns,
		contender{"kscope AtLeastOnce, no-op handler (Apache Kafka)", p.apacheNoop, ab.kscopeNoop, nil},
		contender{"raw franz-go PollFetches loop (Apache Kafka)", p.apacheNoop, ab.rawLoop, nil})
	if err != nil {
		return err
	}
	rep.add(scenario{key: "r1_noop_apache", title: "r1 on Apache Kafka", figs: figs,
		pair: pairOf(figs[0], figs[1]), atLeast: true, noTarget: true, cpu: true})
	return ab.cpuPerRecord(ctx, rep, figs, contender{figs[0].name, p.apacheNoop, ab.kscopeNoop, nil})
}
