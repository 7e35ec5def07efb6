package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// ksDir holds the Kafka Streams harness: a Maven project whose single class
// runs kscope's Kafka-scope workload with processing.guarantee
// exactly_once_v2 and prints {"records":N,"seconds":S}.
const ksDir = "kstreams"

// ksIODelay is the blocking call of peer_kstreams_eos_io and peer_pc_eos.
const ksIODelay = 2 * time.Millisecond

// buildKS builds the Kafka Streams harness once and returns its class path.
func buildKS(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, "mvn", "-q", "-B", "package", "-DskipTests")
	cmd.Dir = ksDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the Kafka Streams harness: %w\n%s", err, out)
	}
	abs, err := filepath.Abs(ksDir)
	if err != nil {
		return "", err
	}
	return filepath.Join(abs, "target", "ks-bench-1.jar") + string(os.PathListSeparator) + filepath.Join(abs, "target", "lib", "*"), nil
}

// kafkaStreams runs the harness as a contender on b's broker and topic with
// threads stream threads and a blocking call of sleep per record.
func (b *bench) kafkaStreams(classpath string, threads int, sleep time.Duration) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) {
		out, err := b.outputTopic(ctx, "bench.out.ks")
		if err != nil {
			return result{}, err
		}
		ctx, cancel := context.WithTimeout(ctx, runTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "java", "-cp", classpath, "dev.kscope.bench.KsBench",
			strings.Join(b.k.Brokers, ","), b.topic, out, b.name("ks"), fmt.Sprint(n), fmt.Sprint(threads), fmt.Sprint(sleep.Milliseconds()))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		stdout, err := cmd.Output()
		if err != nil {
			return result{}, fmt.Errorf("the Kafka Streams harness: %w: %s", err, stderr.String())
		}
		var got struct {
			Records int     `json:"records"`
			Seconds float64 `json:"seconds"`
		}
		lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
			return result{}, fmt.Errorf("the Kafka Streams harness printed %q: %w", stdout, err)
		}
		return result{records: got.Records, elapsed: time.Duration(got.Seconds * float64(time.Second)), handler: sleep}, nil
	}
}

// txnSleep is the Kafka scope with shards key-shards, one output per
// input after a blocking call of sleep: peer_kstreams_eos_io's and
// peer_pc_eos's kscope side.
func (b *bench) txnSleep(shards int, sleep time.Duration) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) {
		out, err := b.outputTopic(ctx, "bench.out.txnio")
		if err != nil {
			return result{}, err
		}
		m := newMeter(n)
		cfg := b.cfg("txnio", shards)
		r, err := txn.New(cfg, txn.Options{TransactionalID: cfg.Group}, txn.HandlerFunc(func(_ context.Context, rec *consumer.Record, e txn.Emitter) error {
			m.start()
			time.Sleep(sleep)
			e.Emit(&kgo.Record{Topic: out, Key: rec.Key, Value: rec.Value})
			return nil
		}))
		if err != nil {
			return result{}, err
		}
		err = untilDone(ctx, m, r.Run, func() int64 { return r.Stats().Kafka.Records })
		res := m.result()
		res.handler = sleep
		return res, err
	}
}

// kstreamsPeers measures peer_kstreams_eos_noop and peer_kstreams_eos_io on
// ab's Apache Kafka.
func (ab *bench) kstreamsPeers(ctx context.Context, p plan, rep *report) error {
	cp, err := buildKS(ctx)
	if err != nil {
		return err
	}
	cores := runtime.NumCPU()
	figs, err := ab.measureWarm(ctx, "peer Kafka Streams exactly_once_v2, no-op (Apache Kafka)", 4, ab.runs+p.ksNoopExtra,
		contender{"kscope Kafka scope, one output per input, commit every 100 ms (Apache Kafka)", p.ksNoop, ab.txnEmit, nil},
		contender{fmt.Sprintf("Kafka Streams %s, exactly_once_v2, %d stream threads, commit.interval.ms 100 (Apache Kafka)", testenv.ApacheKafkaVersion, cores), p.ksNoop, ab.kafkaStreams(cp, cores, 0), nil})
	if err != nil {
		return err
	}
	rep.add(scenario{key: "peer_kstreams_eos_noop", title: "Peer: kscope's Kafka scope against Kafka Streams' exactly-once, no-op (Apache Kafka)", figs: figs,
		pair: pairOf(figs[0], figs[1]), target: 1.0, atLeast: true})
	figs, err = ab.measureWarm(ctx, "peer Kafka Streams exactly_once_v2, 2 ms call (Apache Kafka)", 4, ab.runs,
		contender{"kscope Kafka scope, 64 key-shards, 2 ms call, one output per input (Apache Kafka)", p.ksIO, ab.txnSleep(64, ksIODelay), nil},
		contender{"Kafka Streams " + testenv.ApacheKafkaVersion + ", exactly_once_v2, 8 stream threads (one per partition), 2 ms call (Apache Kafka)", p.ksIO, ab.kafkaStreams(cp, partitions, ksIODelay), nil})
	if err != nil {
		return err
	}
	rep.add(scenario{key: "peer_kstreams_eos_io", title: "Peer: kscope's Kafka scope against Kafka Streams' exactly-once, 2 ms call per record (Apache Kafka)", figs: figs,
		pair: pairOf(figs[0], figs[1]), target: 6, atLeast: true})
	return nil
}

// parallelConsumerEOS runs Parallel Consumer's transactional harness
// (PcEosBench) as a contender on b's broker and topic: KEY ordering,
// concurrency 64, a blocking call of sleep, one output per input.
func (b *bench) parallelConsumerEOS(classpath string, sleep time.Duration) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) {
		out, err := b.outputTopic(ctx, "bench.out.pceos")
		if err != nil {
			return result{}, err
		}
		ctx, cancel := context.WithTimeout(ctx, runTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "java", "-cp", classpath, "dev.kscope.bench.PcEosBench",
			strings.Join(b.k.Brokers, ","), b.topic, out, b.name("pceos"), fmt.Sprint(n), "64", fmt.Sprint(sleep.Milliseconds()))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		stdout, err := cmd.Output()
		if err != nil {
			return result{}, fmt.Errorf("the Parallel Consumer transactional harness: %w: %s", err, stderr.String())
		}
		var got struct {
			Records int     `json:"records"`
			Seconds float64 `json:"seconds"`
		}
		lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
			return result{}, fmt.Errorf("the Parallel Consumer transactional harness printed %q: %w", stdout, err)
		}
		return result{records: got.Records, elapsed: time.Duration(got.Seconds * float64(time.Second)), handler: sleep}, nil
	}
}

// pcEOSPeer measures peer_pc_eos on ab's Apache Kafka.
func (ab *bench) pcEOSPeer(ctx context.Context, p plan, rep *report) error {
	cp, err := buildPC(ctx)
	if err != nil {
		return err
	}
	figs, err := ab.measureWarm(ctx, "peer Parallel Consumer transactional, 2 ms call (Apache Kafka)", 4, ab.rampRuns(p),
		contender{"kscope Kafka scope, 64 key-shards, 2 ms call, one output per input (Apache Kafka)", p.pcEOS, ab.txnSleep(64, ksIODelay), nil},
		contender{"Confluent Parallel Consumer 0.5.3.3, PERIODIC_TRANSACTIONAL_PRODUCER, KEY order, concurrency 64, 2 ms call (Apache Kafka)", p.pcEOS, ab.parallelConsumerEOS(cp, ksIODelay), nil})
	if err != nil {
		return err
	}
	rep.add(scenario{key: "peer_pc_eos", title: "Peer: kscope's Kafka scope against Parallel Consumer's transactional mode, 2 ms call per record (Apache Kafka)", figs: figs,
		pair: pairOf(figs[0], figs[1]), target: 2, atLeast: true})
	return nil
}
