package main

// share_vs_group: a share group's members against a consumer group's, on
// a topic with fewer partitions than members (Apache Kafka).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

const (
	roleMember  = "member"                // a share_vs_group member process
	memberShare = "KSCOPE_BENCH_SHARE"    // "1": the member joins a share group
	shareShards = "KSCOPE_BENCH_SHARDS"   // the member's Config.Shards
	countPrefix = "kscope-bench-handled " // a member's progress line: records handled so far, and its CPU in ns
	memberNoop  = "KSCOPE_BENCH_NOOP"     // "1": the member's handler does nothing (scale_members)

	// The share_vs_group workload: 2 partitions, 4 member processes, a
	// 5 ms handler, 8 key-shards a member.
	sharePartitions = 2
	shareMembers    = 4
	shareMemberSh   = 8
)

// memberChild is a share_vs_group or scale_members member: an AtLeastOnce
// runner with a 5 ms handler (a no-op one for scale_members) in a share
// group or a consumer group, printing how many records it handled, and the
// CPU it used, every 20 ms until SIGTERM.
func memberChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	shards, _ := strconv.Atoi(os.Getenv(shareShards))
	cfg := consumer.Config{
		Brokers: strings.Split(os.Getenv("KAFKA_BROKERS"), ","),
		Group:   os.Getenv(groupEnv),
		Topics:  []string{os.Getenv(topicEnv)},
		Shards:  shards,
		Logger:  slog.New(slog.DiscardHandler),
	}
	if os.Getenv(memberShare) == "1" {
		cfg.Share = &consumer.ShareConfig{}
	}
	var handled atomic.Int64
	noop := os.Getenv(memberNoop) == "1"
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		if !noop {
			time.Sleep(ioDelay)
		}
		handled.Add(1)
		return nil
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				fmt.Printf("%s%d %d\n", countPrefix, handled.Load(), selfCPU().Nanoseconds())
			}
		}
	}()
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// tally sums the members' progress lines: when the first record was
// handled, and when the n-th was; and, for a window that opens once from
// records are handled (0: never), the records and the members' CPU in it.
type tally struct {
	mu      sync.Mutex
	counts  []int64
	cpus    []time.Duration
	first   time.Time
	n       int64
	reached chan time.Time
	// from opens the window; opened is when it did, with the members'
	// records and CPU then.
	from       int64
	opened     time.Time
	openCounts []int64
	openCPU    []time.Duration
	// closeCounts and closeCPU are the members' records and CPU when the
	// n-th record was handled.
	closeCounts []int64
	closeCPU    []time.Duration
}

func newTally(members int, n, from int64) *tally {
	return &tally{counts: make([]int64, members), cpus: make([]time.Duration, members), n: n, from: from, reached: make(chan time.Time, 1)}
}

// note records that member i has handled c records, using cpu.
func (t *tally) note(i int, c int64, cpu time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.counts[i], t.cpus[i] = c, cpu
	var sum int64
	for _, x := range t.counts {
		sum += x
	}
	now := time.Now()
	if sum > 0 && t.first.IsZero() {
		t.first = now
	}
	if t.from > 0 && sum >= t.from && t.opened.IsZero() {
		t.opened = now
		t.openCounts, t.openCPU = slices.Clone(t.counts), slices.Clone(t.cpus)
	}
	if sum >= t.n && t.closeCounts == nil {
		t.closeCounts, t.closeCPU = slices.Clone(t.counts), slices.Clone(t.cpus)
	}
	if sum >= t.n {
		select {
		case t.reached <- now:
		default:
		}
	}
}

// window returns the records the members handled from the window's
// opening to the n-th record, and the CPU they used for them.
func (t *tally) window() (records int64, cpu time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.openCounts == nil || t.closeCounts == nil {
		return 0, 0
	}
	for i := range t.counts {
		records += t.closeCounts[i] - t.openCounts[i]
		cpu += t.closeCPU[i] - t.openCPU[i]
	}
	return records, cpu
}

// startMember starts member process i with env, feeding its progress
// lines to t until it exits; a failure while ctx is live goes to errs.
func startMember(ctx context.Context, self string, i int, env []string, t *tally, wg *sync.WaitGroup, errs chan<- error) error {
	cmd := exec.CommandContext(ctx, self)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = env
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), countPrefix); ok {
				count, cpu, _ := strings.Cut(v, " ")
				c, _ := strconv.ParseInt(count, 10, 64)
				ns, _ := strconv.ParseInt(cpu, 10, 64)
				t.note(i, c, time.Duration(ns))
			}
		}
		if err := cmd.Wait(); err != nil && ctx.Err() == nil {
			errs <- fmt.Errorf("member %d: %w", i, err)
		}
	}()
	return nil
}

// runMembers starts one member process per count of t with env, waits
// until they have handled t's n records (or one fails, ctx ends, or ten
// minutes pass), stops them, and returns when the n-th was handled.
func runMembers(ctx context.Context, env []string, t *tally) (time.Time, error) {
	self, err := os.Executable()
	if err != nil {
		return time.Time{}, err
	}
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(t.counts))
	for i := range t.counts {
		if err := startMember(mctx, self, i, env, t, &wg, errs); err != nil {
			cancel()
			wg.Wait()
			return time.Time{}, err
		}
	}
	var end time.Time
	select {
	case end = <-t.reached:
	case err = <-errs:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(10 * time.Minute):
		err = errors.New("the members did not handle the records within 10 minutes")
	}
	cancel()
	wg.Wait()
	return end, err
}

// members returns the contender of share_vs_group: shareMembers member
// processes of one new group (a share group when share is set) on topic,
// timed from the first record handled to the n-th.
func (b *bench) members(topic string, share bool) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) {
		t := newTally(shareMembers, int64(n), 0)
		env := append(os.Environ(), roleEnv+"="+roleMember, "KAFKA_BROKERS="+strings.Join(b.k.Brokers, ","),
			groupEnv+"="+b.name("members"), topicEnv+"="+topic, shareShards+"="+strconv.Itoa(shareMemberSh), memberShare+"="+map[bool]string{true: "1", false: "0"}[share])
		end, err := runMembers(ctx, env, t)
		if err != nil {
			return result{}, err
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		return result{records: n, elapsed: end.Sub(t.first), handler: ioDelay}, nil
	}
}

// shareVsGroup measures share_vs_group on ab's Apache Kafka: the share
// group's members against the consumer group's, same records (p.share),
// same Shards; no target yet.
func (ab *bench) shareVsGroup(ctx context.Context, rep *report, p plan) error {
	n := p.share
	topic := ab.topic + ".share"
	if err := ab.k.CreateTopic(ctx, topic, sharePartitions); err != nil {
		return fmt.Errorf("creating %s: %w", topic, err)
	}
	ab.logf("share_vs_group: producing %d records to %d partitions", n, sharePartitions)
	if err := ab.produceTo(ctx, topic, n); err != nil {
		return err
	}
	figs, err := ab.measureWarm(ctx, "share_vs_group (Apache Kafka)", 4, ab.rampRuns(p),
		contender{fmt.Sprintf("share group: %d member processes, %d key-shards each, 5 ms handler, %d partitions (Apache Kafka)", shareMembers, shareMemberSh, sharePartitions), n, ab.members(topic, true), nil},
		contender{fmt.Sprintf("consumer group: %d member processes, %d key-shards each, 5 ms handler, %d partitions (Apache Kafka)", shareMembers, shareMemberSh, sharePartitions), n, ab.members(topic, false), nil})
	if err != nil {
		return err
	}
	rep.add(scenario{key: "share_vs_group", title: "Share group against consumer group: 4 members on 2 partitions (Apache Kafka)", figs: figs,
		pair: pairOf(figs[0], figs[1]), atLeast: true, noTarget: true})
	return nil
}

// rampRuns is the measured runs of the scenarios whose peers ramp up
// (plan.rampRuns).
func (ab *bench) rampRuns(p plan) int {
	if p.rampRuns > 0 {
		return min(ab.runs, p.rampRuns)
	}
	return ab.runs
}

// apacheOnly runs share_vs_group (-only share) or the Kafka Streams peers
// (-only kstreams) without the rest of the Apache Kafka scenarios, on the
// run's Apache Kafka or on one started here.
func (b *bench) apacheOnly(ctx context.Context, p plan, rep *report) error {
	if b.k.Kind != "kfake" {
		return b.apacheSome(ctx, p, rep)
	}
	b.logf("Apache Kafka: starting %s", testenv.ApacheKafkaVersion)
	k, err := testenv.StartApacheKafka(ctx, testenv.ApacheOptions{})
	if err != nil {
		return fmt.Errorf("starting Apache Kafka: %w", err)
	}
	defer k.Close()
	ab := &bench{k: k, pg: b.pg, pool: b.pool, runs: b.runs, log: b.log, out: b.out, topic: "bench.records.apache"}
	if n := ab.apacheBacklog(p); n > 0 {
		b.logf("Apache Kafka: producing %d records", n)
		if err := ab.produceBacklog(ctx, ab.topic, n); err != nil {
			return err
		}
	}
	return ab.apacheSome(ctx, p, rep)
}

// apacheBacklog is how many records the backlog topic needs for the
// Apache Kafka scenarios -only names.
func (ab *bench) apacheBacklog(p plan) int {
	n := 0
	if p.has("kstreams") {
		n = max(p.ksNoop, p.ksIO, p.pcEOS)
	}
	if p.has("cpu") {
		n = max(n, p.apacheNoop)
	}
	return n
}

// apacheSome runs the Apache Kafka scenarios -only names: share_vs_group,
// the Kafka Streams and Parallel Consumer transactional peers, r1 on Apache
// Kafka with cpu_per_record.
func (ab *bench) apacheSome(ctx context.Context, p plan, rep *report) error {
	if p.has("cpu") {
		if err := ab.r1Apache(ctx, p, rep); err != nil {
			return err
		}
	}
	if p.has("share") {
		if err := ab.shareVsGroup(ctx, rep, p); err != nil {
			return err
		}
	}
	if p.has("kstreams") {
		if err := ab.kstreamsPeers(ctx, p, rep); err != nil {
			return err
		}
		return ab.pcEOSPeer(ctx, p, rep)
	}
	return nil
}
