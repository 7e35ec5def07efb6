// Command bench measures kscope against the baselines of its performance
// targets and writes BENCHMARKS.md (make bench, make bench-quick).
//
// Every figure is a ratio of two rates measured in the same run on the same
// backends: an in-process kfake broker and a throwaway local PostgreSQL by
// default, or KAFKA_BROKERS and DATABASE_URL. Each rate is the median of
// several runs, each on a fresh consumer group reading the same topic. The
// quick mode uses smaller record counts and prints, as its last line, one
// JSON object with the ratios.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// plan is the size of one benchmark run.
type plan struct {
	mode      string
	backlog   int // records in the benchmark topic
	noop      int // records per r1 run
	db        int // records per DB-scope run
	dbExec    int // records per run of r3's Exec handler, shown for comparison (no ratio reads it; a round trip a record makes it slow)
	naive     int // records per naive-loop run
	ceiling   int // records per ceiling run
	watermill int // records per Watermill run
	ioSeconds float64
	// Seconds of the 5 ms handler per Parallel Consumer run (and kscope's
	// beside it): Parallel Consumer raises its concurrency over its first
	// seconds, so a shorter run measures its ramp, not its rate.
	pcSeconds float64
	txn       int // records per r5 run of the Kafka scope
	alo       int // records per r5 run of AtLeastOnce producing synchronously
	// On the Apache Kafka broker: records per r1 run and per r5 run (the
	// Kafka scope's, then AtLeastOnce's).
	apacheNoop, apacheTxn, apacheAlo int
	share                            int // share_vs_group's records
	// scale is scale_members' records (the quick run measures it only
	// when -only names it).
	scale               int
	ksNoop, ksIO, pcEOS int // the Kafka Streams peers' and peer_pc_eos's records
	rssFor              time.Duration
	// Measured runs of the two scenarios whose rounds agree within a few
	// percent and last longest, Parallel Consumer's (about 20 seconds a
	// round) and the peak RSS (15 seconds a run); 0 means -runs. The quick
	// run spends the time on more rounds of the short, noisy ones.
	pcRuns, rssRuns int
	// rampRuns is the measured runs of share_vs_group and peer_pc_eos
	// (0 means -runs). Their peers take the first seconds of a run to
	// reach their rate (the share group's members join and its
	// acquisitions spread over them; Parallel Consumer raises its
	// concurrency), so the quick run reads them on the full run's records,
	// in fewer rounds: on fewer records (8,000 and 16,000) its ratios were
	// 0.90 and 1.33 of the full run's, beyond the full run's own spread.
	rampRuns int
	sweeps   bool // shard-count and batch-size sweeps
	// untargeted says the run measures the two long rows that have no
	// target, peer_parallel_consumer (about 45 seconds) and
	// r5_dedupe_cost_apache (about 60): the full run does, and a quick
	// run when -only names pc. The quick run keeps to the rows with a
	// target and those issue 53 asks of it.
	untargeted bool
	// r5ApacheExtra is the measured runs r5 on Apache Kafka makes beyond
	// -runs: r5ApacheExtraRuns in the full run, none in the quick one
	// (whose median of three ignores one slow round all the same).
	r5ApacheExtra int
	// ksNoopExtra is the measured runs peer_kstreams_eos_noop makes
	// beyond -runs: ksNoopExtraRuns in the full run, none in the quick one.
	ksNoopExtra int
	only        map[string]bool
}

// runs reports whether the plan includes the scenario.
func (p plan) has(name string) bool { return p.only == nil || p.only[name] }

// The runs of both modes are long enough for their steady state (the
// window after the first tenth of a run's records, see meter) to dominate,
// so that the quick run's ratios agree with the full run's; the full run
// repeats the scenarios on more records and adds the sweeps. The backlog
// is the same in both: the peak-RSS child consumes it (how many records it
// holds in flight depends on the topic it reads). AtLeastOnce's r5 runs on
// Apache Kafka, whose handler produces each output synchronously, read
// 50,000 records in the quick run and 200,000 in the full one: on
// 2026-11-25, runs of 60,000 read a lower rate than runs of 200,000 while
// the broker's JIT warmed up, but the quick run now comes to them after
// the other Apache Kafka scenarios, and on 2026-11-30 its runs of 45,000
// records in the window read 6,800 to 7,500 records/s against the full
// run's 6,500 to 6,900 (r5_txn_vs_alo_apache 42.7 against 43.1), in a
// minute instead of two and a half.
// The Kafka scope's r5 runs on Apache Kafka, the same in both modes too,
// read a million records: at 400,000 a run lasted about a second, and its
// rate moved by a third from run to run. So does peer_kstreams_eos_noop:
// when Kafka Streams was timed from its first input, its start included,
// the quick run's ratio on 200,000 records was 4.96 and 5.16 against the
// full run's 3.03 on 500,000 (the peers' harnesses now leave the first
// tenth out, as the meter does). share_vs_group and peer_pc_eos are the
// same in both too, in fewer rounds in the quick run (plan.rampRuns).
var plans = map[string]plan{
	"quick": {mode: "quick", backlog: 2_000_000, noop: 1_000_000, db: 100_000, dbExec: 25_000, naive: 2_000, ceiling: 100_000,
		watermill: 5_000, ioSeconds: 3, pcSeconds: 8, txn: 500_000, alo: 150_000, apacheNoop: 2_000_000, apacheTxn: 1_000_000, apacheAlo: 50_000, share: 20_000, scale: 4_000_000, ksNoop: 500_000, ksIO: 16_000, pcEOS: 40_000, rssFor: 15 * time.Second, pcRuns: 2, rssRuns: 2, rampRuns: 2},
	"full": {mode: "full", backlog: 2_000_000, noop: 2_000_000, db: 300_000, dbExec: 300_000, naive: 5_000, ceiling: 300_000,
		watermill: 10_000, ioSeconds: 8, pcSeconds: 8, txn: 500_000, alo: 500_000, apacheNoop: 2_000_000, apacheTxn: 1_000_000, apacheAlo: 200_000, share: 20_000, scale: 8_000_000, ksNoop: 500_000, ksIO: 40_000, pcEOS: 40_000, rssFor: 15 * time.Second, sweeps: true, untargeted: true, r5ApacheExtra: r5ApacheExtraRuns, ksNoopExtra: ksNoopExtraRuns},
}

func main() {
	switch os.Getenv(roleEnv) {
	case roleRSS:
		os.Exit(rssChild())
	case roleMember:
		os.Exit(memberChild())
	}
	mode := flag.String("mode", "quick", "quick or full")
	out := flag.String("out", "../BENCHMARKS.md", "where to write the report")
	svg := flag.String("svg", "../BENCHMARKS-shards.svg", "where the full run writes the shard-count chart")
	runs := flag.Int("runs", 3, "measured runs per figure (the median is reported)")
	summaryPath := flag.String("summary", "", "also write the last line (the JSON summary) to this file")
	quickPath := flag.String("quick", "", "a quick run's summary file (-summary) to show beside this run's ratios")
	only := flag.String("only", "", "run only these scenarios, comma-separated: r1, r3, r3batch, r4, apache (the Apache Kafka figures, share_vs_group included; a quick run adds peer_parallel_consumer and r5_dedupe_cost_apache, the full run's, when pc is named too), share (share_vs_group alone), kstreams (the exactly-once peers alone), cpu (r1 on Apache Kafka and cpu_per_record alone), scale (scale_members: 1 to 6 members on a 3-node Apache Kafka cluster; in the full run, or in a quick one when named here), r5, rss, sweeps")
	flag.Parse()
	if *only != "" {
		p := plans[*mode]
		p.only = map[string]bool{}
		for _, s := range strings.Split(*only, ",") {
			p.only[strings.TrimSpace(s)] = true
		}
		plans[*mode] = p
	}
	p, ok := plans[*mode]
	if !ok || *runs < 1 {
		fmt.Fprintln(os.Stderr, "bench: -mode is quick or full, -runs at least 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var quick map[string]any
	if *quickPath != "" {
		data, err := os.ReadFile(*quickPath)
		if err == nil {
			err = json.Unmarshal(data, &quick)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: reading the quick run's summary:", err)
			os.Exit(2)
		}
	}
	rep, err := run(ctx, p, *runs, *out, *svg, quick)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	line, _ := json.Marshal(rep.summary())
	if *summaryPath != "" {
		if err := os.WriteFile(*summaryPath, append(line, '\n'), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
	fmt.Println(string(line))
}

func run(ctx context.Context, p plan, runs int, outPath, svgPath string, quick map[string]any) (*report, error) {
	started := time.Now()
	machine0, children0 := machineCPU(), childrenCPU()
	b := &bench{runs: runs, log: slog.New(slog.DiscardHandler), out: os.Stderr, topic: "bench.records"}
	k, err := testenv.StartKafka(ctx)
	if err != nil {
		return nil, err
	}
	defer k.Close()
	b.k = k
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		return nil, err
	}
	defer pg.Close()
	b.pg = pg
	dbURL := pg.URL
	if pg.Kind != "external" {
		if dbURL, err = pg.NewDatabase(ctx, "bench"); err != nil {
			return nil, err
		}
	}
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = 24 // at least the default 16 shards, as the DB scope's docs ask
	if b.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, err
	}
	defer b.pool.Close()
	if err := b.setupDB(ctx); err != nil {
		return nil, err
	}
	if k.Kind == "external" {
		b.topic = b.name("bench.records")
	}

	rep := newReport(p, runs, k.Kind, pg)
	rep.quick = quick
	b.logf("producing the %d-record backlog to %s (%d partitions, %d keys, %d-byte values)", p.backlog, b.topic, partitions, keys, valueSize)
	t0 := time.Now()
	if err := b.produceBacklog(ctx, b.topic, p.backlog); err != nil {
		return nil, err
	}
	rep.produceTime = time.Since(t0)

	if err := b.scenarios(ctx, p, rep); err != nil {
		return nil, err
	}
	rep.total = time.Since(started)
	// What the machine did besides this run: its own process, its children
	// and the PostgreSQL server (all of whose CPU is counted from its start).
	ours := selfCPU() + childrenCPU() - children0 + b.pgCPU()
	rep.otherCores = max(0, (machineCPU()-machine0-ours).Seconds()/rep.total.Seconds())
	if err := rep.write(outPath, svgPath); err != nil {
		return nil, err
	}
	b.logf("wrote %s in %s", outPath, rep.total.Round(time.Second))
	return rep, nil
}

// scenarios runs every scenario of the plan and fills rep.
func (b *bench) scenarios(ctx context.Context, p plan, rep *report) error {
	ideal := func(shards int) float64 { return float64(shards) / ioDelay.Seconds() }
	ioN := func(shards int) int { return int(ideal(shards) * p.ioSeconds) }

	if p.has("r1") {
		if err := b.r1(ctx, p, rep); err != nil {
			return err
		}
	}
	if p.has("r3") {
		if err := b.r3(ctx, p, rep); err != nil {
			return err
		}
	}
	if p.has("r3batch") {
		if err := b.r3Batch(ctx, p, rep); err != nil {
			return err
		}
	}
	if p.has("r4") {
		if err := b.r4(ctx, rep, ioN(64), ideal(64)); err != nil {
			return err
		}
	}
	if p.has("apache") || p.has("pc") {
		if err := b.apache(ctx, p, rep, int(ideal(64)*p.pcSeconds)); err != nil {
			return err
		}
	} else if p.has("share") || p.has("kstreams") || p.has("cpu") {
		if err := b.apacheOnly(ctx, p, rep); err != nil {
			return err
		}
	}
	if p.scale > 0 && p.has("scale") && (p.mode == "full" || p.only["scale"]) {
		if err := b.scale(ctx, rep, p.scale, b.runs); err != nil {
			return err
		}
	}
	if p.has("r5") {
		if err := b.r5(ctx, p, rep); err != nil {
			return err
		}
	}
	if p.has("rss") {
		if err := b.rss(ctx, p, rep); err != nil {
			return err
		}
	}
	if p.sweeps && p.has("sweeps") {
		if err := b.sweeps(ctx, p, rep, ioN, ideal); err != nil {
			return err
		}
	}
	return b.profileMissed(ctx, rep)
}

// r1ExtraRuns is how many more measured runs r1 on kfake makes than the
// other scenarios. Its runs are the shortest (a quarter to half a second)
// and the noisiest: back to back, one build's single-run ratios spread from
// 0.69 to 1.18, and a median of three still by about 0.09 (standard
// deviation over eight repetitions); with seven rounds, one round of a
// full run strayed from its median by up to 13%, and a quick run's median
// from the full run's by 11%. A round costs under a second.
const r1ExtraRuns = 14

// r1ApacheExtraRuns is the same for r1 on Apache Kafka, whose rounds last
// under a second and strayed from their median by up to 11% (three rounds).
const r1ApacheExtraRuns = 8

// r5ApacheExtraRuns is the same for r5 on Apache Kafka: AtLeastOnce's
// synchronous produce waits on the JVM broker for each record, and one of
// three rounds now and then ran 15% to 20% slower than the other two.
const r5ApacheExtraRuns = 1

// ksNoopExtraRuns is the same for peer_kstreams_eos_noop in the full run.
// kscope's side of it lasts 0.6 to 3 seconds, and its rate follows the
// broker's: on the same 450,000 records it read 293,000 to 703,000
// records/s in one quick run of three rounds, 433,000 to 504,000 in the
// full run after it, whose three rounds then understated the ratio's
// spread (3.82 quick against 2.38 full). Seven rounds show it.
const ksNoopExtraRuns = 4

// r5DedupeExtraRuns is the same for r5_dedupe_cost on kfake, whose rounds
// also warm up on runs of full size. On 2026-11-28, four quick runs of
// seven rounds after warm-ups of a fifth of the records: the first three
// rounds' ratios spread from 0.45 to 1.05 (the scope without the guard ran
// at 580,000 to 660,000 records a second in the first two and at 420,000
// to 480,000 from the fourth on, as the in-process broker's heap grew),
// the last four from 0.71 to 0.91.
const r5DedupeExtraRuns = 2

// r1: the runner's own overhead. Its warm-up runs are full-size: each
// contender's first run reads the whole backlog, and the in-process broker
// serves the part no earlier run read a third slower, which a warm-up on a
// fifth of the records left to kscope's first measured run alone.
func (b *bench) r1(ctx context.Context, p plan, rep *report) error {
	figs, err := b.measureWarm(ctx, "r1 no-op", 1, b.runs+r1ExtraRuns,
		contender{"kscope AtLeastOnce, no-op handler", p.noop, b.kscopeNoop, nil},
		contender{"raw franz-go PollFetches loop", p.noop, b.rawLoop, nil})
	if err != nil {
		return err
	}
	rep.add(scenario{key: "r1_noop", title: "r1: AtLeastOnce overhead (no-op handler)", figs: figs,
		pair: pairOf(figs[0], figs[1]), atLeast: true, noTarget: true, cpu: true})
	return nil
}

// r3 and the Watermill peer: the DB scope.
func (b *bench) r3(ctx context.Context, p plan, rep *report) error {
	db := contender{"kscope DB scope, Exec handler (defaults: 16 shards, batch 256)", p.dbExec, b.kscopeDB(0), b.resetDB}
	dbq := contender{"kscope DB scope, queued handler (defaults: 16 shards, batch 256)", p.db, b.kscopeDBQueued(0), b.resetDB}
	figs, err := b.measure(ctx, "r3 DB scope", dbq, db,
		contender{"naive loop: a transaction and a sync offset commit per record", p.naive, b.naiveDB, b.resetDB},
		contender{fmt.Sprintf("PostgreSQL ceiling: %d records per transaction, %d connections, no Kafka", ceilingBatch, ceilingConns), p.ceiling, b.ceilingDB, b.resetDB},
		contender{"Watermill (Sarama) subscriber, a transaction per message", p.watermill, b.watermillDB, b.resetDB})
	if err != nil {
		return err
	}
	// figs: the queued handler (the ratios' numerator), the Exec handler,
	// then the baselines.
	q, x, naive, ceiling, wm := figs[0], figs[1], figs[2], figs[3], figs[4]
	rep.add(scenario{key: "r3_db_vs_naive", title: "r3: DB scope against the naive loop", figs: []figure{q, x, naive},
		pair: pairOf(q, naive), target: 10, atLeast: true, profile: dbq, cpu: true})
	rep.add(scenario{key: "r3_db_vs_ceiling", title: "r3: DB scope against PostgreSQL's ceiling", figs: []figure{q, x, ceiling},
		pair: pairOf(q, ceiling), target: 0.8, atLeast: true, profile: dbq, cpu: true})
	rep.add(scenario{key: "peer_watermill", title: "Peer: DB scope against Watermill", figs: []figure{q, x, wm, ceiling},
		pair: pairOf(q, wm), target: 10, atLeast: true, profile: dbq, cpu: true})
	return nil
}

// r4: an I/O-bound handler on 64 shards.
func (b *bench) r4(ctx context.Context, rep *report, n int, ideal float64) error {
	io := contender{"kscope AtLeastOnce, 5 ms handler, 64 shards", n, b.kscopeIO(64), nil}
	figs, err := b.measure(ctx, "r4 I/O-bound", io,
		contender{"no Kafka: 64 goroutines sleeping 5 ms a record (the timer's ceiling)", n, timerCeiling(64), nil})
	if err != nil {
		return err
	}
	rep.add(scenario{key: "r4_io_efficiency", title: "r4: I/O-bound handler (5 ms), 64 key-shards", figs: figs,
		ideal: ideal, ratio: figs[0].median / ideal, target: 0.85, atLeast: true, profile: io})
	// The timer's ceiling is what 64 sleeping goroutines reach on this
	// machine (timer slack makes it a little below the nominal ideal):
	// that is the runner's real bound.
	rep.add(scenario{key: "r4_vs_timer", title: "r4: I/O-bound handler against the timer's ceiling", figs: figs,
		pair: pairOf(figs[0], figs[1]), target: 0.97, atLeast: true})
	return nil
}

// r5: the Kafka scope against AtLeastOnce producing.
func (b *bench) r5(ctx context.Context, p plan, rep *report) error {
	tx := contender{"kscope Kafka scope (txn), one output per input, 100ms commit interval", p.txn, b.txnEmit, nil}
	figs, err := b.measure(ctx, "r5 Kafka scope", tx,
		contender{"kscope AtLeastOnce, handler producing synchronously", p.alo, b.aloProduce, nil})
	if err != nil {
		return err
	}
	rep.add(scenario{key: "r5_txn_vs_alo", title: "r5: Kafka scope against AtLeastOnce producing", figs: figs,
		pair: pairOf(figs[0], figs[1]), target: 0.7, atLeast: true, cpu: true, profile: tx})
	on := contender{"kscope Kafka scope with the idempotency guard (Options.Dedupe)", p.txn, b.txnEmitWith(&txn.DedupeOptions{}), nil}
	figs, err = b.measureWarm(ctx, "r5 dedupe cost", 1, b.runs+r5DedupeExtraRuns, on,
		contender{"the same scope without it", p.txn, b.txnEmitWith(nil), nil})
	if err != nil {
		return err
	}
	rep.add(scenario{key: "r5_dedupe_cost", title: "r5: the Kafka scope's idempotency guard against the same scope without it", figs: figs,
		pair: pairOf(figs[0], figs[1]), target: 0.8, atLeast: true, cpu: true, profile: on})
	return nil
}

// rss: the peak RSS of a separate consumer process on the backlog.
func (b *bench) rss(ctx context.Context, p plan, rep *report) error {
	var peaks []float64
	runs := b.runs
	if p.rssRuns > 0 {
		runs = min(runs, p.rssRuns)
	}
	for i := range runs {
		r, err := b.measureRSS(ctx, p.rssFor)
		if err != nil {
			return fmt.Errorf("peak RSS run %d: %w", i+1, err)
		}
		b.logf("peak RSS run %d: %.1f MiB after %s, %d records handled, max in flight %d records / %d bytes",
			i+1, r.peakMiB, r.for_, r.report.Handled, r.report.MaxInFlight, r.report.MaxInFlightBytes)
		rep.rss = append(rep.rss, r)
		peaks = append(peaks, r.peakMiB)
	}
	rep.add(scenario{key: "peak_rss_mib", title: fmt.Sprintf("Peak RSS of a consumer on a %s-record backlog", group(int64(p.backlog))), ratio: median(peaks), target: 128})
	return nil
}

// sweeps: throughput against shard count (5 ms handler) and DB-scope
// throughput against batch size.
func (b *bench) sweeps(ctx context.Context, p plan, rep *report, ioN func(int) int, ideal func(int) float64) error {
	for _, shards := range []int{1, 2, 4, 8, 16, 32, 64, 128} {
		figs, err := b.measure(ctx, fmt.Sprintf("shard sweep %d", shards),
			contender{fmt.Sprintf("%d shards", shards), ioN(shards), b.kscopeIO(shards), nil})
		if err != nil {
			return err
		}
		rep.shardSweep = append(rep.shardSweep, sweepPoint{x: shards, rate: figs[0].median, ideal: ideal(shards), handler: figs[0].handlerLatency()})
	}
	for _, bound := range []int{25_000, 100_000, 200_000} {
		figs, err := b.measure(ctx, fmt.Sprintf("in-flight sweep %d", bound),
			contender{fmt.Sprintf("kscope, MaxInFlightRecords %d", bound), p.noop, b.kscopeNoopBound(bound), nil},
			contender{"raw franz-go PollFetches loop", p.noop, b.rawLoop, nil})
		if err != nil {
			return err
		}
		bc, _ := figs[0].cpuPerRecord()
		rep.boundSweep = append(rep.boundSweep, sweepPoint{x: bound, rate: figs[0].median, ideal: figs[1].median, benchCPU: bc})
	}
	// The sweep's small batches run at a few thousand records/s: a third of
	// r3's records keeps it to minutes.
	sweepN := p.db / 3
	for _, batch := range []int{1, 4, 16, 64, 256, 1024} {
		figs, err := b.measure(ctx, fmt.Sprintf("batch sweep %d", batch),
			contender{fmt.Sprintf("batch %d, queued handler", batch), sweepN, b.kscopeDBQueued(batch), b.resetDB},
			contender{fmt.Sprintf("batch %d, Exec handler", batch), sweepN, b.kscopeDB(batch), b.resetDB})
		if err != nil {
			return err
		}
		for i, to := range []*[]sweepPoint{&rep.batchSweepQueued, &rep.batchSweep} {
			bc, pc := figs[i].cpuPerRecord()
			*to = append(*to, sweepPoint{x: batch, rate: figs[i].median, benchCPU: bc, pgCPU: pc, perTxn: figs[i].recordsPerTxn()})
		}
	}
	return nil
}

// profileMissed runs kscope's side of every missed target once more, under
// the CPU profiler.
func (b *bench) profileMissed(ctx context.Context, rep *report) error {
	for i := range rep.scenarios {
		s := &rep.scenarios[i]
		if s.met() || s.profile.run == nil {
			continue
		}
		b.logf("%s missed its target: profiling one more run", s.key)
		prof, err := b.profileRun(ctx, s.profile)
		if err != nil {
			return fmt.Errorf("profiling %s: %w", s.key, err)
		}
		s.profileText = prof
	}
	return nil
}
