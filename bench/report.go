package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// scenario is one ratio and the figures behind it.
type scenario struct {
	key     string
	title   string
	figs    []figure
	ideal   float64 // the denominator when it is computed, not measured
	ratio   float64
	pair    *pairing // when the ratio is of two measured contenders: how it was formed (ratio is set from it)
	target  float64
	atLeast bool // the target is a floor (else a ceiling)
	cpu     bool // show CPU per record
	// noTarget: the ratio is reported, with no target (yet) to meet.
	noTarget bool

	profile     contender // kscope's side, profiled when the target is missed
	profileText string
}

// shown is s's ratio as the report writes it: digits (significant, for
// the summary table's %g, or decimals for %f) as format asks, and more
// where those would round a missed ratio onto its target (0.7996 written
// 0.800, missed) or a met one off it.
func (s scenario) shown(format string, digits int) string {
	v := fmt.Sprintf(format, digits, s.ratio)
	for more := digits + 1; !s.noTarget && more <= 12; more++ {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || (scenario{ratio: r, target: s.target, atLeast: s.atLeast}).met() == s.met() {
			break
		}
		v = fmt.Sprintf(format, more, s.ratio)
	}
	return v
}

func (s scenario) met() bool {
	if s.noTarget {
		return true
	}
	if s.atLeast {
		return s.ratio >= s.target
	}
	return s.ratio <= s.target
}

type sweepPoint struct {
	x               int
	rate, ideal     float64
	benchCPU, pgCPU float64
	handler         time.Duration // mean handler latency (shard sweep)
	perTxn          float64       // records per transaction (batch sweep)
}

// report collects a benchmark run and renders BENCHMARKS.md.
type report struct {
	plan             plan
	runs             int
	kafkaKind        string
	pgKind           string
	started          time.Time
	load0            string
	produceTime      time.Duration
	total            time.Duration
	otherCores       float64 // CPU other processes used during the run, in cores on average
	scenarios        []scenario
	rss              []rssRun
	shardSweep       []sweepPoint
	batchSweep       []sweepPoint // the Exec handler
	batchSweepQueued []sweepPoint
	boundSweep       []sweepPoint // r1 against MaxInFlightRecords; ideal holds the raw loop's rate
	scale            []scalePoint // scale_members, by group size
	svgName          string
	quick            map[string]any // a quick run's summary, shown beside the full run's ratios
}

func newReport(p plan, runs int, kafkaKind string, pg *testenv.Postgres) *report {
	return &report{plan: p, runs: runs, kafkaKind: kafkaKind, pgKind: pg.Kind, started: time.Now().UTC(), load0: loadavg()}
}

func (r *report) add(s scenario) {
	if s.pair != nil {
		s.ratio = s.pair.ratio
	}
	r.scenarios = append(r.scenarios, s)
}

// summary is the JSON line the program prints last.
func (r *report) summary() map[string]any {
	out := map[string]any{"mode": r.plan.mode, "started": r.started.Format("2006-01-02 15:04 UTC")}
	missed := []string{}
	for _, s := range r.scenarios {
		out[s.key], _ = strconv.ParseFloat(s.shown("%.*f", 3), 64)
		if !s.met() {
			missed = append(missed, s.key)
		}
	}
	out["missed"] = missed
	return out
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "MemTotal:") {
			var kb int64
			fmt.Sscanf(strings.TrimPrefix(l, "MemTotal:"), "%d", &kb)
			return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
		}
	}
	return "unknown"
}

func rate(v float64) string {
	switch {
	case v >= 100:
		return group(int64(math.Round(v)))
	default:
		return fmt.Sprintf("%.1f", v)
	}
}

// group writes n with thousands separators.
func group(n int64) string {
	s := fmt.Sprint(n)
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// write renders the report, BENCHMARKS.md, at path, and the chart of the
// shard sweep at svgPath.
func (r *report) write(path, svgPath string) error {
	var b strings.Builder
	r.writeResults(&b)
	r.writeMethod(&b)
	r.writeMachine(&b)
	for _, s := range r.scenarios {
		r.writeScenario(&b, s)
	}
	if len(r.shardSweep) > 0 {
		if err := r.writeShardSweep(&b, svgPath); err != nil {
			return err
		}
	}
	r.writeBoundSweep(&b)
	r.writeBatchSweep(&b)
	writeMicro(&b)
	// Before-and-after measurements of past changes are kept in
	// comparisons.md and carried into every report.
	if cmp, err := os.ReadFile(comparisonsFile); err == nil {
		b.WriteString("\n")
		b.Write(cmp)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// writeResults writes the title and the table of the ratios against their
// targets, with the quick run's beside them when there is one.
func (r *report) writeResults(b *strings.Builder) {
	p := r.plan
	fmt.Fprintf(b, "# kscope benchmarks\n\n")
	fmt.Fprintf(b, "Generated by `%s` (the program in [bench/](bench/)) on %s, in %s.\n\n",
		map[string]string{"quick": "make bench-quick", "full": "make bench"}[p.mode], r.started.Format("2006-01-02 15:04 UTC"), r.total.Round(time.Second))

	b.WriteString("## Results\n\n| ratio | value | target | |\n| --- | ---: | ---: | --- |\n")
	for _, s := range r.scenarios {
		op := ">="
		if !s.atLeast {
			op = "<="
		}
		verdict := "met"
		if !s.met() {
			verdict = "**missed**: see below"
		}
		if s.noTarget {
			fmt.Fprintf(b, "| `%s` | %.3g | none yet | reported |\n", s.key, s.ratio)
			continue
		}
		fmt.Fprintf(b, "| `%s` | %s | %s %g | %s |\n", s.key, s.shown("%.*g", 3), op, s.target, verdict)
	}
	r.writeQuick(b)
}

// writeMethod writes how the figures are measured: the backends, the
// topic, the runs, the warm-up, the rounds and the CPU accounting.
func (r *report) writeMethod(b *strings.Builder) {
	p := r.plan
	b.WriteString("\n## Method\n\n")
	b.WriteString(`- Every figure is a **ratio** of two rates measured in the same run, on the same
  backends, against the same topic. Absolute numbers depend on the machine
  and on what else runs on it; the ratios are what the targets are about.
`)
	fmt.Fprintf(b, `- Backends: Kafka is %s; PostgreSQL is %s with its default settings
  (`+"`synchronous_commit=on`, `fsync=on`"+`: every commit waits for its WAL flush).
  The in-process kfake broker shares the CPU with the consumer under test:
  its cost is part of every Kafka figure, for kscope and baselines alike.
`, kafkaDesc(r.kafkaKind), pgDesc(r.pgKind))
	fmt.Fprintf(b, `- The topic: %s records, %d partitions, keys drawn uniformly from %s keys
  (%d-byte keys), %d-byte values, no headers, no compression. Producing it took %s.
- Each run uses a fresh consumer group that reads the topic from its start and
  stops when the given number of records is done (for kscope: its effect is
  durable, as the runner counts it; for the loops: after their commit or ack).
  The rate is that of the run's steady state: the records done in its window
  / the window's length, the window opening when a tenth of the run's records
  are done (group join, first fetches and workers starting are behind it) and
  closing when the last is done. Every contender, the Parallel Consumer
  harness included, is timed over the same window, and a short run measures
  the same rate as a long one.
- Warm-up: each contender runs once on a fifth of its records before the
  measured runs; r1's contenders, on both brokers, on all of them (r1's first
  full read of the backlog ran a third slower, on kfake and on the JVM broker
  alike), r5_dedupe_cost's on all of them (its first rounds after a short
  warm-up spread from 0.45 to 1.05, its later ones from 0.71 to 0.91), and r5's on Apache Kafka on half. Then the
  contenders of a scenario run interleaved (A B A B ...), %d times each (r1, whose runs are the shortest and noisiest, %d times on kfake and %d on Apache Kafka; r5 on Apache Kafka %d times; r5_dedupe_cost %d times; peer_kstreams_eos_noop %d times); the **median** is reported, with every run listed. A ratio is the median of the rounds' ratios: in each round the contenders run one after the other, on the machine as it is at that moment, so a round's ratio is not moved by what changes between rounds (the host's other load, PostgreSQL's checkpoints); each ratio's line gives the rounds' ratios and the ratio of the median rates beside it.
- DB scenarios empty the inbox and effect tables and checkpoint before each
  run, outside its timing. CPU per record is the CPU the bench process (broker
  included) used over the run's window, the one its rate is timed over (group
  join, start-up and shutdown left out, as for the rate), divided by the
  window's records; the PostgreSQL server's is its CPU over the whole run
  over the same records. "cores busy" is the bench process's CPU per record
  times the rate: how many cores the contender kept busy.
`, group(int64(p.backlog)), partitions, group(keys), keySize, valueSize, r.produceTime.Round(100*time.Millisecond), r.runs, r.runs+r1ExtraRuns, r.runs+r1ApacheExtraRuns, r.runs+p.r5ApacheExtra, r.runs+r5DedupeExtraRuns, r.runs+p.ksNoopExtra)
	if p.mode == "quick" {
		b.WriteString("- This is the **quick** run (`make bench-quick`): smaller record counts than `make bench`, same method")
		if p.pcRuns > 0 || p.rssRuns > 0 {
			fmt.Fprintf(b, "; Parallel Consumer's scenario runs %d rounds and the peak RSS %d runs (their rounds agree within a few percent, and they are the longest), so that the short, noisy scenarios get more", max(p.pcRuns, 1), max(p.rssRuns, 1))
		}
		if p.rampRuns > 0 {
			fmt.Fprintf(b, "; share_vs_group and peer_pc_eos run on the full run's records in %d rounds (their peers take a run's first seconds to reach their rate, which fewer records would measure instead)", p.rampRuns)
		}
		b.WriteString(".\n")
	}
}

// writeMachine writes what the run ran on, and how busy the machine was
// with other work.
func (r *report) writeMachine(b *strings.Builder) {
	b.WriteString("\n## Machine\n\n")
	host, _ := os.Hostname()
	fmt.Fprintf(b, "- %s, %d logical CPUs, %s RAM, %s/%s, %s\n", cpuModel(), runtime.NumCPU(), memTotal(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	fmt.Fprintf(b, "- Load average at the start: %s; at the end: %s (host %s).\n", r.load0, loadavg(), host)
	fmt.Fprintf(b, "- Other processes used %.2f cores on average during the run (busy CPU from /proc/stat, less this program's, its children's and PostgreSQL's).", r.otherCores)
	if r.otherCores >= 0.1 {
		b.WriteString(" This run **shared the machine** with other work: expect noise in the absolute numbers and some in the ratios " +
			"(the contenders of a scenario run interleaved to spread it); a re-run on a quiet machine gives cleaner figures.")
	}
	b.WriteString("\n")
}

// writeScenario writes a scenario's section: its figures, its ratio
// against the target, its note, and when the target is missed, why and
// where the time goes.
func (r *report) writeScenario(b *strings.Builder, s scenario) {
	fmt.Fprintf(b, "\n## %s\n\n", s.title)
	switch s.key {
	case "peak_rss_mib":
		r.writeRSS(b, s)
		return
	case scaleKey:
		r.writeScale(b, s)
		return
	}
	writeFigs(b, s.figs, s.cpu)
	if s.ideal > 0 {
		writeIdeal(b, s)
	}
	writeRatio(b, s)
	if note := notes[s.key]; note != "" {
		b.WriteString("\n" + note + "\n")
	}
	if !s.met() || s.noTarget {
		if why := analysis(s, r.otherCores); why != "" {
			b.WriteString("\n### Why\n\n" + why + "\n")
		}
	}
	if s.profileText != "" {
		b.WriteString("\n### Where the time goes\n\n" + s.profileText)
	}
}

// writeIdeal writes how a scenario with a computed ideal (r4) compares
// with it: the handler's real sleep, and the timer's ceiling beside it.
func writeIdeal(b *strings.Builder, s scenario) {
	fmt.Fprintf(b, "\nIdeal: 64 shards / 5 ms = %s records/s.", rate(s.ideal))
	if h := s.figs[0].handlerLatency(); h > 0 {
		fmt.Fprintf(b, " The handler's `time.Sleep(5 * time.Millisecond)` took %.2f ms on average (the timer's overshoot on this machine), "+
			"so even a runner with no cost of its own would reach %.3f of the ideal; against 64 / %.2f ms the runner's efficiency is %.3f.",
			h.Seconds()*1000, ioDelay.Seconds()/h.Seconds(), h.Seconds()*1000, s.figs[0].median*h.Seconds()/64)
	}
	if len(s.figs) > 1 {
		c := s.figs[1]
		fmt.Fprintf(b, " The timer's ceiling (the second row: the same sleeps, 64 goroutines, no Kafka, run interleaved with kscope) "+
			"reached %s records/s, %.3f of the ideal, its sleeps taking %.2f ms; kscope reached %.3f of it.",
			rate(c.median), c.median/s.ideal, c.handlerLatency().Seconds()*1000, s.figs[0].median/c.median)
	}
	b.WriteString("\n")
}

// writeRatio writes a scenario's ratio against its target, and the rounds
// it is the median of.
func writeRatio(b *strings.Builder, s scenario) {
	op := ">="
	if !s.atLeast {
		op = "<="
	}
	if s.noTarget {
		fmt.Fprintf(b, "\nRatio `%s` = %.3f (no target yet: reported).", s.key, s.ratio)
	} else {
		fmt.Fprintf(b, "\nRatio `%s` = %s (target %s %g): %s.", s.key, s.shown("%.*f", 3), op, s.target, map[bool]string{true: "met", false: "**missed**"}[s.met()])
	}
	if s.pair != nil && len(s.pair.rounds) > 0 {
		rs := make([]string, len(s.pair.rounds))
		for i, x := range s.pair.rounds {
			rs[i] = fmt.Sprintf("%.3f", x)
		}
		if s.pair.wholeRun > 0 {
			fmt.Fprintf(b, " It is the median of the rounds' ratios (%s); the ratio of the median CPU per record is %.3f, "+
				"and over whole runs (start-up and stop included, over the window's records) %.3f.", strings.Join(rs, ", "), s.pair.byMedians, s.pair.wholeRun)
		} else {
			fmt.Fprintf(b, " It is the median of the rounds' ratios (%s); the ratio of the median rates is %.3f.", strings.Join(rs, ", "), s.pair.byMedians)
		}
	}
	b.WriteString("\n")
}

// writeShardSweep writes the throughput against the key-shard count as a
// table, and as the chart at svgPath.
func (r *report) writeShardSweep(b *strings.Builder, svgPath string) error {
	b.WriteString("\n## Throughput against key-shard count (5 ms handler)\n\n")
	r.svgName = filepath.Base(svgPath)
	fmt.Fprintf(b, "![throughput against shards](%s)\n\n", r.svgName)
	b.WriteString("| shards | records/s (median) | ideal (shards / 5 ms) | efficiency | mean handler time | efficiency against shards / handler time |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, pt := range r.shardSweep {
		fmt.Fprintf(b, "| %d | %s | %s | %.3f | %.2f ms | %.3f |\n", pt.x, rate(pt.rate), rate(pt.ideal), pt.rate/pt.ideal,
			pt.handler.Seconds()*1000, pt.rate*pt.handler.Seconds()/float64(pt.x))
	}
	return os.WriteFile(svgPath, []byte(shardSVG(r.shardSweep)), 0o644)
}

// writeBoundSweep writes r1 against the in-flight bound, when measured.
func (r *report) writeBoundSweep(b *strings.Builder) {
	if len(r.boundSweep) == 0 {
		return
	}
	b.WriteString("\n## r1 against the in-flight bound\n\n")
	b.WriteString("The no-op AtLeastOnce runner of r1 with `Config.MaxInFlightRecords` set, against the raw loop measured beside it " +
		"(interleaved, as in r1). The runner polls while half the bound is free, and takes what fits. With a small bound a poll takes " +
		"part of the response the client buffered, and the client sends its next fetch only once the rest is taken: the poll loop waits " +
		"for room while the workers drain, and the workers wait while it polls. With half the bound above a fetch response (on this backlog " +
		"3,000 to 38,000 records) a poll takes the whole response, and the client fetches the next while the workers run the last. " +
		"The default is 100,000: each in-flight record holds about 300 bytes of bookkeeping besides its key, value and headers, " +
		"so a larger bound is a trade of memory (see the peak RSS) for the last part of a very fast handler's throughput, left to the user.\n\n")
	b.WriteString("| MaxInFlightRecords | kscope records/s (median) | raw loop records/s (median) | ratio | kscope bench CPU µs/record |\n| ---: | ---: | ---: | ---: | ---: |\n")
	for _, pt := range r.boundSweep {
		fmt.Fprintf(b, "| %s | %s | %s | %.3f | %.2f |\n", group(int64(pt.x)), rate(pt.rate), rate(pt.ideal), pt.rate/pt.ideal, pt.benchCPU)
	}
}

// writeBatchSweep writes the DB scope's throughput against the batch
// size, when measured.
func (r *report) writeBatchSweep(b *strings.Builder) {
	if len(r.batchSweep) == 0 {
		return
	}
	b.WriteString("\n## DB-scope throughput against batch size\n\n")
	b.WriteString("`dbscope.Options.BatchSize` (default 256), 16 shards, a pool of 24 connections, the one-row handler queued " +
		"(`dbscope.NewQueued`) and run with `tx.Exec`; " + group(int64(r.plan.db/3)) + " records per run (a third of r3's). " +
		"A batch is what a shard has queued when it starts a transaction, up to the batch size.\n\n")
	b.WriteString("| batch size | queued: records/s (median) | records per transaction | bench CPU µs/record | PostgreSQL CPU µs/record | Exec: records/s (median) | records per transaction | bench CPU µs/record | PostgreSQL CPU µs/record |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for i, pt := range r.batchSweep {
		q := r.batchSweepQueued[i]
		fmt.Fprintf(b, "| %d | %s | %.1f | %.0f | %.0f | %s | %.1f | %.0f | %.0f |\n", pt.x, rate(q.rate), q.perTxn, q.benchCPU, q.pgCPU,
			rate(pt.rate), pt.perTxn, pt.benchCPU, pt.pgCPU)
	}
}

// writeMicro says what the Go micro-benchmarks that make bench runs
// measure.
func writeMicro(b *strings.Builder) {
	b.WriteString("\n## Micro-benchmarks\n\n`make bench` also runs the Go micro-benchmarks of the hot paths " +
		"(`go test -run '^$' -bench . -benchmem ./...`): key-shard routing (`partition`), the commit watermark (`commit`), " +
		"the failure-header encode and decode (`retrytopic`), and, in `consumer`, a record's identity, the delivery hooks with none registered and the runner's whole path for a no-op record " +
		"(`BenchmarkDispatchToDone`: routing a poll's records to their key-shards, the workers, the done reports and the watermark, in ns per record), with allocation counts. Their output goes to the terminal.\n")
}

func kafkaDesc(kind string) string {
	switch kind {
	case "kfake":
		return "franz-go's kfake, in the benchmark process (one broker)"
	case "external":
		return "the brokers in `KAFKA_BROKERS`"
	}
	return kind
}

func pgDesc(kind string) string {
	switch kind {
	case "local":
		return "a throwaway local server (initdb + pg_ctl, loopback TCP)"
	case "external":
		return "the server in `DATABASE_URL`"
	}
	return kind
}

func writeFigs(b *strings.Builder, figs []figure, cpu bool) {
	pg, txns := false, false
	for _, f := range figs {
		_, pc := f.cpuPerRecord()
		pg = pg || pc > 0
		txns = txns || f.recordsPerTxn() > 0
	}
	b.WriteString("| contender | records per run | runs (records/s) | median records/s |")
	if cpu {
		b.WriteString(" bench CPU µs/record |")
		if pg {
			b.WriteString(" PostgreSQL CPU µs/record |")
		}
		b.WriteString(" cores busy |")
	}
	if txns {
		b.WriteString(" records per transaction |")
	}
	b.WriteString("\n| --- | ---: | --- | ---: |")
	if cpu {
		b.WriteString(" ---: |")
		if pg {
			b.WriteString(" ---: |")
		}
		b.WriteString(" ---: |")
	}
	if txns {
		b.WriteString(" ---: |")
	}
	b.WriteString("\n")
	for _, f := range figs {
		var rs []string
		for _, v := range f.rates() {
			rs = append(rs, rate(v))
		}
		fmt.Fprintf(b, "| %s | %s | %s | **%s** |", f.name, group(int64(f.records)), strings.Join(rs, ", "), rate(f.median))
		if cpu {
			bc, pc := f.cpuPerRecord()
			fmt.Fprintf(b, " %.1f |", bc)
			if pg {
				fmt.Fprintf(b, " %.1f |", pc)
			}
			fmt.Fprintf(b, " %.2f |", (bc+pc)*f.median/1e6)
		}
		if txns {
			fmt.Fprintf(b, " %.1f |", f.recordsPerTxn())
		}
		b.WriteString("\n")
	}
}

func (r *report) writeRSS(b *strings.Builder, s scenario) {
	fmt.Fprintf(b, "The consumer runs as a child process (this program re-executed), so the broker's copy of the backlog "+
		"is not in its memory. It uses the default configuration (%d shards, MaxInFlightRecords %s, MaxInFlightBytes %d MiB) "+
		"and a handler that waits %s, so the backlog is far larger than what is in flight: backpressure bounds memory. "+
		"Each run consumes for %s, then gets SIGTERM; its peak RSS is the child's `VmHWM` (the high-water mark of its resident set, "+
		"from /proc/self/status, read as it stops).\n\n"+
		"The child's rusage `Maxrss` is listed too, and is not the child's: Go starts a child with clone(CLONE_VM|CLONE_VFORK), "+
		"so it runs in the parent's address space until exec, and Linux's exec records the high-water mark of the address space it "+
		"leaves (`exec_mmap` → `setmax_mm_hiwater_rss`) in the child's `Maxrss`. That is the benchmark process's own peak, "+
		"with the in-process broker holding the whole backlog.\n\n",
		consumer.DefaultShards, group(consumer.DefaultMaxInFlightRecords), consumer.DefaultMaxInFlightBytes>>20, slowDelay, r.plan.rssFor)
	b.WriteString("| run | peak RSS MiB (VmHWM) | rusage Maxrss MiB | records handled | max in flight (records) | max in flight (bytes) | backpressure pauses |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for i, x := range r.rss {
		fmt.Fprintf(b, "| %d | %.1f | %.1f | %s | %s | %s | %d |\n", i+1, x.peakMiB, x.rusageMiB, group(x.report.Handled), group(x.report.MaxInFlight), group(x.report.MaxInFlightBytes), x.report.Pauses)
	}
	fmt.Fprintf(b, "\nMedian peak RSS: %.1f MiB (target <= %g): %s.\n", s.ratio, s.target, map[bool]string{true: "met", false: "**missed**"}[s.met()])
}

// comparisonsFile holds the before-and-after runs of past changes, which
// every report ends with.
const comparisonsFile = "comparisons.md"

// writeQuick shows the quick run's ratios beside the full run's, with their
// difference and the full run's spread of each ratio's rounds: the quick
// run is a check of the full one only while each of its ratios lies within
// that spread (or within 10%, where that is wider or there are no rounds).
func (r *report) writeQuick(b *strings.Builder) {
	if r.quick == nil {
		return
	}
	b.WriteString("\n### The quick run beside it\n\n")
	fmt.Fprintf(b, "`make bench-quick` (%v) ran just before this run, on the same machine; `make bench` runs both. ", r.quick["started"])
	b.WriteString("Its runs are shorter, timed over the same steady-state window (see Method).\n\n")
	b.WriteString("The last column is the spread of the full run's own rounds (their lowest and highest ratio, against the full run's ratio): " +
		"how far one round of the full run strays from the run's median on this machine.\n\n")
	b.WriteString("| ratio | full | quick | quick / full | full run's rounds / full |\n| --- | ---: | ---: | ---: | ---: |\n")
	worst, worstKey := 0.0, ""
	var outside []string
	for _, s := range r.scenarios {
		spread := "—"
		lo, hi := 0.9, 1.1 // a ratio without rounds agrees within 10%
		if s.pair != nil && len(s.pair.rounds) > 1 && s.ratio > 0 {
			lo, hi = min(lo, slices.Min(s.pair.rounds)/s.ratio), max(hi, slices.Max(s.pair.rounds)/s.ratio)
			spread = fmt.Sprintf("%.3f to %.3f", slices.Min(s.pair.rounds)/s.ratio, slices.Max(s.pair.rounds)/s.ratio)
		}
		q, ok := r.quick[s.key].(float64)
		if !ok {
			fmt.Fprintf(b, "| `%s` | %.3g | — | — | %s |\n", s.key, s.ratio, spread)
			continue
		}
		rel := q / s.ratio
		if d := math.Abs(rel - 1); d > worst {
			worst, worstKey = d, s.key
		}
		if rel < lo || rel > hi {
			outside = append(outside, "`"+s.key+"`")
		}
		fmt.Fprintf(b, "| `%s` | %.3g | %.3g | %.3f | %s |\n", s.key, s.ratio, q, rel, spread)
	}
	fmt.Fprintf(b, "\nLargest difference: %.1f%% (`%s`). ", worst*100, worstKey)
	if len(outside) == 0 {
		b.WriteString("Every ratio of the quick run lies within the full run's spread of its rounds (or within 10% of a ratio without rounds): the quick run agrees with the full one.\n")
		return
	}
	fmt.Fprintf(b, "**Outside the full run's spread of its rounds (and 10%%):** %s: the quick run does not agree with the full one there.\n", strings.Join(outside, ", "))
}
