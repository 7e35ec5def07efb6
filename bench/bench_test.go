package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/internal/testenv"
)

// TestNoopScenario runs r1 on a tiny backlog, end to end: both contenders,
// the medians, the ratio, the report and the JSON summary.
func TestNoopScenario(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := testenv.KafkaT(t)
	b := &bench{k: k, runs: 1, log: slog.New(slog.DiscardHandler), out: io.Discard, topic: "bench.tiny"}
	if err := b.produceBacklog(ctx, b.topic, 3000); err != nil {
		t.Fatal(err)
	}
	p := plan{mode: "quick", backlog: 3000, noop: 2000}
	rep := &report{plan: p, runs: 1, kafkaKind: k.Kind, pgKind: "none", started: time.Now()}
	if err := b.r1(ctx, p, rep); err != nil {
		t.Fatal(err)
	}
	s := rep.scenarios[0]
	for _, f := range s.figs {
		if len(f.runs) != 1+r1ExtraRuns || f.median <= 0 || f.runs[0].records <= 0 || f.runs[0].records > 2000 {
			t.Fatalf("%s: runs %+v, median %v", f.name, f.runs, f.median)
		}
	}
	if s.ratio <= 0 {
		t.Fatalf("ratio %v", s.ratio)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "BENCHMARKS.md")
	if err := rep.write(out, filepath.Join(dir, "chart.svg")); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| `r1_noop` |") || !strings.Contains(string(md), "raw franz-go PollFetches loop") {
		t.Fatalf("report lacks the r1 figures:\n%s", md)
	}
	if _, ok := rep.summary()["r1_noop"]; !ok {
		t.Fatalf("summary %v lacks r1_noop", rep.summary())
	}
}

// TestMeterWindow: a run is timed from the moment a tenth of its records
// are done, and counts only the records done after that.
func TestMeterWindow(t *testing.T) {
	m := newMeter(100)
	m.add(4)
	if m.warmAt.Load() != 0 {
		t.Fatal("the window opened before a tenth of the records were done")
	}
	m.add(11) // 15 done: the window opens here
	m.add(85)
	select {
	case <-m.done:
	default:
		t.Fatal("the meter did not finish at its target")
	}
	if r := m.result(); r.records != 85 || r.elapsed != time.Duration(m.end.Load()-m.warmAt.Load()) {
		t.Fatalf("result %+v: want the 85 records after the window opened, over the window", r)
	}
	one := newMeter(100)
	one.add(100) // a single batch: no window, the whole run counts
	if r := one.result(); r.records != 100 {
		t.Fatalf("result %+v: want the whole run when the window never opened before the end", r)
	}
}

// A run's CPU per record is read over its window, as its rate is: the CPU
// spent before the window opens (start-up) is left out, and cpu_per_record
// pairs the rounds' window figures, with the whole runs' beside them.
func TestCPUPerRecordOverTheWindow(t *testing.T) {
	m := newMeter(100)
	m.add(5)
	burn := func() {
		for start := selfCPU(); selfCPU()-start < 20*time.Millisecond; {
		}
	}
	burn() // start-up: outside the window
	m.add(10)
	burn()
	m.add(85)
	r := m.result()
	if r.windowCPU < 20*time.Millisecond || r.windowCPU >= 40*time.Millisecond {
		t.Fatalf("window CPU %s: want the 20 ms burnt inside the window, not the start-up's", r.windowCPU)
	}
	run := func(window, whole time.Duration) result {
		return result{records: 1000, elapsed: time.Second, windowCPU: window, benchCPU: whole}
	}
	k := figure{runs: []result{run(300*time.Microsecond, 500*time.Microsecond), run(330*time.Microsecond, 600*time.Microsecond)}}
	raw := figure{runs: []result{run(200*time.Microsecond, 250*time.Microsecond), run(220*time.Microsecond, 300*time.Microsecond)}}
	p := cpuPairOf(k, raw)
	if p.ratio != 1.5 || p.wholeRun != 2 {
		t.Fatalf("cpu_per_record %.3f, whole runs %.3f: want 1.5 over the windows and 2 over whole runs", p.ratio, p.wholeRun)
	}
	if b, _ := k.cpuPerRecord(); b < 0.31 || b > 0.32 {
		t.Fatalf("kscope's bench CPU %.3f µs a record: want the windows' median, 0.315", b)
	}
}

// A ratio pairs the runs of one round: a machine twice as fast in the
// second round moves both contenders, not their ratio.
func TestPairOf(t *testing.T) {
	fig := func(rates ...float64) figure {
		f := figure{}
		for _, r := range rates {
			f.runs = append(f.runs, result{records: int(r), elapsed: time.Second})
		}
		f.median = median(f.rates())
		return f
	}
	p := pairOf(fig(80, 160, 90), fig(100, 200, 120))
	if p.ratio != 0.8 || len(p.rounds) != 3 || p.rounds[2] != 0.75 {
		t.Fatalf("pairOf = %+v; want the median of 0.8, 0.8, 0.75", p)
	}
	if p.byMedians != 0.75 {
		t.Fatalf("byMedians = %v; want 90/120", p.byMedians)
	}
	if q := pairOf(fig(80, 160), fig(100, 200, 120)); q.ratio != q.byMedians || q.rounds != nil {
		t.Fatalf("pairOf of unequal run counts = %+v; want the ratio of the medians", q)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {nil, 0}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestShardSVG(t *testing.T) {
	svg := shardSVG([]sweepPoint{{x: 1, rate: 190, ideal: 200}, {x: 2, rate: 380, ideal: 400}, {x: 4, rate: 700, ideal: 800}})
	if !strings.HasPrefix(svg, "<svg") || strings.Count(svg, "<polyline") != 2 || strings.Contains(svg, "NaN") {
		t.Fatalf("bad chart:\n%s", svg)
	}
}

// TestMissedPeerAnalysesSayWhy: a missed Parallel Consumer or Apache r1
// ratio is explained from the run's own figures, and a missed scenario
// without a profile does not point at one.
func TestMissedPeerAnalysesSayWhy(t *testing.T) {
	ioFig := func(rate float64, handler time.Duration) figure {
		return figure{median: rate, runs: []result{{records: 1000, elapsed: time.Second, handler: handler}}}
	}
	pc := scenario{key: "peer_parallel_consumer", figs: []figure{ioFig(12000, 5330*time.Microsecond), ioFig(12300, 5224*time.Microsecond)},
		ratio: 12000.0 / 12300, target: 1.2, atLeast: true}
	got := analysis(pc, 0)
	for _, want := range []string{"5.330 ms", "5.224 ms", "cannot be met", "1.041× Parallel Consumer"} {
		if !strings.Contains(got, want) {
			t.Errorf("peer_parallel_consumer analysis lacks %q:\n%s", want, got)
		}
	}
	cpu := func(rate float64, perRecord time.Duration) figure {
		return figure{median: rate, runs: []result{{records: 1_000_000, elapsed: time.Second, benchCPU: perRecord * 1_000_000}}}
	}
	r1 := scenario{key: "r1_noop_apache", figs: []figure{cpu(3e6, 390*time.Nanosecond), cpu(4e6, 260*time.Nanosecond)},
		ratio: 0.75, target: 0.9, atLeast: true, cpu: true}
	if got := analysis(r1, 0); !strings.Contains(got, "0.39 µs per record under kscope") || !strings.Contains(got, "0.26 µs under the raw loop") {
		t.Errorf("r1_noop_apache analysis:\n%s", got)
	}
	other := scenario{key: "r5_txn_vs_alo_apache", figs: []figure{ioFig(1, 0), ioFig(2, 0)}, ratio: 0.5, target: 0.7, atLeast: true}
	for _, s := range []scenario{pc, r1, other} {
		if got := analysis(s, 0); strings.Contains(got, "%!") || (s.key == other.key && strings.Contains(got, "profile below")) {
			t.Errorf("%s analysis: %s", s.key, got)
		}
	}
}

// The quick run agrees with the full one while each ratio lies within the
// full run's spread of that ratio's rounds, or within 10% where that is
// wider; a ratio outside both is named.
func TestQuickAgreesWithinTheFullRunsSpread(t *testing.T) {
	r := &report{scenarios: []scenario{
		{key: "wide", ratio: 1, pair: &pairing{ratio: 1, rounds: []float64{0.7, 1, 1.3}}},
		{key: "narrow", ratio: 1, pair: &pairing{ratio: 1, rounds: []float64{0.99, 1, 1.01}}},
		{key: "alone", ratio: 2},
	}}
	for _, c := range []struct {
		quick   map[string]any
		outside string // "" when the quick run agrees
	}{
		{map[string]any{"wide": 1.25, "narrow": 1.08, "alone": 2.1}, ""},
		{map[string]any{"wide": 1.35, "narrow": 1.0, "alone": 2.0}, "`wide`"},
		{map[string]any{"wide": 1.0, "narrow": 1.12, "alone": 1.7}, "`narrow`, `alone`"},
	} {
		r.quick = c.quick
		var b strings.Builder
		r.writeQuick(&b)
		got := b.String()
		if c.outside == "" && !strings.Contains(got, "the quick run agrees with the full one") {
			t.Errorf("quick %v: want agreement, got\n%s", c.quick, got)
		}
		if c.outside != "" && !strings.Contains(got, "**Outside the full run's spread of its rounds (and 10%):** "+c.outside+":") {
			t.Errorf("quick %v: want %s named outside, got\n%s", c.quick, c.outside, got)
		}
	}
}

// A ratio that rounds onto its target from the wrong side is written with
// one more digit, so that the verdict beside it reads true.
func TestShownRatioAgreesWithItsVerdict(t *testing.T) {
	for _, c := range []struct {
		s          scenario
		table, row string
	}{
		{scenario{ratio: 0.7996, target: 0.8, atLeast: true}, "0.7996", "0.7996"},
		{scenario{ratio: 0.7, target: 0.8, atLeast: true}, "0.7", "0.700"},
		{scenario{ratio: 0.8004, target: 0.8, atLeast: true}, "0.8", "0.800"},
		{scenario{ratio: 1.3004, target: 1.3}, "1.3004", "1.3004"},
		{scenario{ratio: 0.7996, noTarget: true}, "0.8", "0.800"},
	} {
		if got := c.s.shown("%.*g", 3); got != c.table {
			t.Errorf("%+v in the table: %s, want %s", c.s, got, c.table)
		}
		if got := c.s.shown("%.*f", 3); got != c.row {
			t.Errorf("%+v in its section: %s, want %s", c.s, got, c.row)
		}
	}
}

// The Kafka Streams peer runs the broker's release (issue: the exactly-once
// peers): bench/kstreams/pom.xml pins the same version as the Apache Kafka
// backend.
func TestKafkaStreamsPeerIsTheBrokersRelease(t *testing.T) {
	pom, err := os.ReadFile("kstreams/pom.xml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`<artifactId>kafka-streams</artifactId>\s*<version>([^<]+)</version>`).FindSubmatch(pom)
	if m == nil {
		t.Fatal("bench/kstreams/pom.xml names no kafka-streams version")
	}
	if got := string(m[1]); got != testenv.ApacheKafkaVersion {
		t.Fatalf("bench/kstreams/pom.xml runs Kafka Streams %s against Apache Kafka %s; set its version to %s", got, testenv.ApacheKafkaVersion, testenv.ApacheKafkaVersion)
	}
}

// The JVM peers' harnesses leave out the same warm-up as the meter that
// times kscope's side (warmFraction): a peer timed with its start would be
// measured on a different window from kscope's.
func TestJVMPeersTimedAsTheMeterIs(t *testing.T) {
	want := fmt.Sprintf("seen >= n / %d && seen < n", warmFraction)
	for _, f := range []string{"kstreams/src/main/java/dev/kscope/bench/KsBench.java", "pc/src/main/java/dev/kscope/bench/PcEosBench.java"} {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(src), want) {
			t.Errorf("bench/%s does not open its window where the meter does (%q): time it from the first 1/%d of its outputs committed", f, want, warmFraction)
		}
	}
}
