package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// meter times one run in its steady state: from the moment a tenth of the
// target count of records is done (the warm-up: group join, first fetches,
// workers starting) to the moment the target count is. The same window
// applies to every contender, so a short run and a long one measure the
// same rate.
type meter struct {
	target int64
	warmN  int64 // records done before the window opens
	n      atomic.Int64
	first  atomic.Int64 // unix nanoseconds of the first record seen
	warmAt atomic.Int64 // unix nanoseconds when warmN records were done
	warmed atomic.Int64 // records done at warmAt
	end    atomic.Int64
	// The bench process's CPU (getrusage) when the window opened and when
	// it closed: the CPU a record costs in the run's steady state, as the
	// rate is measured (start-up and stop are outside it).
	cpuAt, cpuEnd atomic.Int64
	done          chan struct{}
	once          sync.Once
}

// warmFraction is the share of a run's records done before its window opens.
const warmFraction = 10

func newMeter(target int) *meter {
	return &meter{target: int64(target), warmN: int64(target) / warmFraction, done: make(chan struct{})}
}

// start marks the first record seen; later calls are cheap no-ops.
func (m *meter) start() {
	if m.first.Load() == 0 {
		m.first.CompareAndSwap(0, time.Now().UnixNano())
	}
}

// observe opens the window once n records are done, if it is not open yet.
func (m *meter) observe(n int64) {
	if n >= m.warmN && m.warmAt.Load() == 0 && m.warmAt.CompareAndSwap(0, time.Now().UnixNano()) {
		m.warmed.Store(n)
		m.cpuAt.Store(int64(selfCPU()))
	}
}

// add counts k finished records.
func (m *meter) add(k int64) {
	m.start()
	n := m.n.Add(k)
	m.observe(n)
	if n >= m.target {
		m.finish()
	}
}

func (m *meter) finish() {
	m.once.Do(func() {
		m.end.Store(time.Now().UnixNano())
		m.cpuEnd.Store(int64(selfCPU()))
		close(m.done)
	})
}

// result returns the run's rate over its window (over the whole run when
// the window did not open before the end, as with a run of one batch).
func (m *meter) result() result {
	end, at, warmed := m.end.Load(), m.warmAt.Load(), m.warmed.Load()
	if at > 0 && end > at && warmed < m.target {
		return result{records: int(m.target - warmed), elapsed: time.Duration(end - at),
			windowCPU: time.Duration(m.cpuEnd.Load() - m.cpuAt.Load())}
	}
	return result{records: int(m.target), elapsed: time.Duration(end - m.first.Load())}
}

// result is one run of one contender.
type result struct {
	records  int
	elapsed  time.Duration
	benchCPU time.Duration // CPU of the bench process (the in-process broker included) over the run
	// windowCPU is the bench process's CPU over the run's window, the
	// records of which are records (0 when the window did not open).
	windowCPU time.Duration
	pgCPU     time.Duration // CPU of the local PostgreSQL server over the run (0 when not measured)
	txns      int64         // DB transactions the DB scope committed (0 for other contenders)
	handler   time.Duration // the I/O-bound handler's mean measured latency (0 for other contenders)
}

func (r result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.records) / r.elapsed.Seconds()
}

// runTimeout bounds one measured run.
const runTimeout = 5 * time.Minute

// untilDone runs a runner until done() reaches the meter's target, then
// stops it and waits for Run to return.
func untilDone(ctx context.Context, m *meter, run func(context.Context) error, done func() int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- run(ctx) }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(runTimeout)
	defer deadline.Stop()
	for {
		select {
		case err := <-errc:
			return fmt.Errorf("stopped after %d of %d records: %v", done(), m.target, err)
		case <-deadline.C:
			cancel()
			<-errc
			return fmt.Errorf("timed out after %s with %d of %d records done", runTimeout, done(), m.target)
		case <-tick.C:
			d := done()
			m.observe(d)
			if d >= m.target {
				m.finish()
				cancel()
				return <-errc
			}
		}
	}
}

// waitMeter waits for a meter driven by the code under test itself.
func waitMeter(ctx context.Context, m *meter, errc <-chan error) error {
	t := time.NewTimer(runTimeout)
	defer t.Stop()
	select {
	case <-m.done:
		return nil
	case err := <-errc:
		if err == nil {
			err = fmt.Errorf("stopped after %d of %d records", m.n.Load(), m.target)
		}
		return err
	case <-t.C:
		return fmt.Errorf("timed out after %s with %d of %d records done", runTimeout, m.n.Load(), m.target)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// contender is one side of a comparison: run consumes n records of the
// benchmark topic with a fresh consumer group and returns the timing.
type contender struct {
	name string
	n    int
	run  func(ctx context.Context, n int) (result, error)
	// prepare, when set, runs before each run, outside its timing and
	// CPU accounting (the DB contenders empty their tables).
	prepare func(ctx context.Context) error
}

// figure is a contender's measured runs.
type figure struct {
	name    string
	runs    []result
	median  float64
	records int
}

func (f figure) rates() []float64 {
	out := make([]float64, len(f.runs))
	for i, r := range f.runs {
		out[i] = r.rate()
	}
	return out
}

// handlerLatency returns the median of the runs' mean handler latencies.
func (f figure) handlerLatency() time.Duration {
	var xs []float64
	for _, r := range f.runs {
		if r.handler > 0 {
			xs = append(xs, float64(r.handler))
		}
	}
	return time.Duration(median(xs))
}

// recordsPerTxn returns the median records per DB transaction, 0 when the
// contender does not count its transactions.
func (f figure) recordsPerTxn() float64 {
	var xs []float64
	for _, r := range f.runs {
		if r.txns > 0 {
			xs = append(xs, float64(r.records)/float64(r.txns))
		}
	}
	return median(xs)
}

// cpuPerRecord returns the median CPU microseconds per record of the bench
// process, over each run's window (result.cpuPerRecord), and of
// PostgreSQL, over each whole run.
func (f figure) cpuPerRecord() (bench, pg float64) {
	var bs, ps []float64
	for _, r := range f.runs {
		bs = append(bs, r.cpuPerRecord()/1e3)
		ps = append(ps, float64(r.pgCPU.Microseconds())/float64(r.records))
	}
	return median(bs), median(ps)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// measure warms every contender up once on a fifth of its records, then
// runs them interleaved (A B A B ...), runs times each, and returns each
// one's runs and median rate.
func (b *bench) measure(ctx context.Context, title string, cs ...contender) ([]figure, error) {
	return b.measureWarm(ctx, title, 5, b.runs, cs...)
}

// measureWarm is measure with warm-up runs of 1/warmDiv of each
// contender's records. A JVM broker needs longer than kfake to reach its
// steady state (its first full-size runs were a third slower than the
// rest): its fast scenarios warm up on runs of full size.
func (b *bench) measureWarm(ctx context.Context, title string, warmDiv, runs int, cs ...contender) ([]figure, error) {
	b.logf("%s: warm-up", title)
	for _, c := range cs {
		if _, err := b.timed(ctx, c, max(c.n/warmDiv, 1)); err != nil {
			return nil, fmt.Errorf("%s: %s warm-up: %w", title, c.name, err)
		}
	}
	figs := make([]figure, len(cs))
	for i, c := range cs {
		figs[i] = figure{name: c.name, records: c.n}
	}
	for run := range runs {
		for i, c := range cs {
			res, err := b.timed(ctx, c, c.n)
			if err != nil {
				return nil, fmt.Errorf("%s: %s run %d: %w", title, c.name, run+1, err)
			}
			figs[i].runs = append(figs[i].runs, res)
			b.logf("%s: %s run %d: %d records in %s = %.0f records/s, %.0f ns of bench CPU a record (%.0f over the whole run)", title, c.name, run+1, res.records, res.elapsed.Round(time.Millisecond), res.rate(), res.cpuPerRecord(), res.wholeCPUPerRecord())
		}
	}
	for i := range figs {
		figs[i].median = median(figs[i].rates())
	}
	return figs, nil
}

// timed runs a contender once and adds the CPU the bench process and the
// local PostgreSQL spent over the run.
func (b *bench) timed(ctx context.Context, c contender, n int) (result, error) {
	if c.prepare != nil {
		if err := c.prepare(ctx); err != nil {
			return result{}, err
		}
	}
	// Every run starts on a collected heap. The in-process broker holds the
	// whole backlog in this process's heap: a collection that falls inside
	// a short run marks all of it, and whether one does depends on what the
	// previous contender allocated (runs of the DB scope were bimodal, about
	// 97,000 or 150,000 records/s, on that alone). A consumer against a real
	// broker does not carry the backlog in its heap.
	runtime.GC()
	cpu0, pg0 := selfCPU(), b.pgCPU()
	res, err := c.run(ctx, n)
	res.benchCPU, res.pgCPU = selfCPU()-cpu0, b.pgCPU()-pg0
	return res, err
}

// machineCPU returns the busy CPU time of the whole machine so far, from
// /proc/stat (user, nice, system, irq, softirq, steal).
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var ticks int64
	for _, k := range []int{1, 2, 3, 6, 7, 8} {
		if k < len(f) {
			v, _ := strconv.ParseInt(f[k], 10, 64)
			ticks += v
		}
	}
	return time.Duration(ticks) * (time.Second / 100)
}

// childrenCPU returns the CPU time of this process's waited-for children
// (the peak-RSS consumers, the PostgreSQL tools).
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pgCPU returns the CPU time used so far by the local PostgreSQL server
// (the postmaster and its backends), read from /proc; 0 for an external
// server.
func (b *bench) pgCPU() time.Duration {
	if b.pg == nil || b.pg.DataDir == "" {
		return 0
	}
	pidFile, err := os.ReadFile(filepath.Join(b.pg.DataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	master := strings.TrimSpace(strings.SplitN(string(pidFile), "\n", 2)[0])
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, p := range procs {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(raw)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		// Fields after the command: state ppid ... utime(14) stime(15)
		// cutime(16) cstime(17), numbered from 1 with pid.
		f := strings.Fields(s[i+1:])
		if len(f) < 13 {
			continue
		}
		pid := strings.TrimSuffix(strings.TrimPrefix(filepath.Dir(p), "/proc/"), "/")
		if pid != master && f[1] != master {
			continue
		}
		for _, k := range []int{11, 12} {
			v, _ := strconv.ParseInt(f[k], 10, 64)
			ticks += v
		}
		if pid == master {
			// Backends that exited: their CPU is the postmaster's
			// children's time (cutime, cstime).
			for _, k := range []int{13, 14} {
				v, _ := strconv.ParseInt(f[k], 10, 64)
				ticks += v
			}
		}
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ is 100 on Linux
}

// pairing is a ratio of two contenders' rates (scenario.pair).
type pairing struct {
	ratio     float64   // the median of the rounds' ratios
	rounds    []float64 // each round's ratio
	byMedians float64   // the ratio of the contenders' median rates
	wholeRun  float64   // cpu_per_record: the median ratio of the rounds' CPU over whole runs
}

// pairOf returns the ratio of a's rate to b's as the median of their
// rounds' ratios: the contenders of a scenario run interleaved, one round
// each after the other, so the i-th runs of a and b share the machine's
// state of that moment (the host's other load, PostgreSQL's checkpoints
// and WAL), which the ratio of their medians mixes across rounds.
// Figures with different run counts (none here) fall back to the ratio of
// their medians.
func pairOf(a, b figure) *pairing {
	p := &pairing{byMedians: a.median / b.median}
	if len(a.runs) != len(b.runs) || len(a.runs) == 0 {
		p.ratio = p.byMedians
		return p
	}
	for i := range a.runs {
		p.rounds = append(p.rounds, a.runs[i].rate()/b.runs[i].rate())
	}
	p.ratio = median(p.rounds)
	return p
}
