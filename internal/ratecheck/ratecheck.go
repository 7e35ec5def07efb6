// Package ratecheck is the proof of a rate limit (consumer.Config.RateLimit)
// that every scope passes: on a backlog, a runner limited to PerSecond
// records a second calls its handler at that rate within Tolerance over
// the window, and its process's CPU stays under the bound while limited
// (the waits sleep: no busy loop). It also holds the measuring helpers
// the consumer package's tests of the other limits (bytes, per topic)
// use.
//
// The window and the CPU bound depend on the backend. On Apache Kafka
// (KSCOPE_KAFKA=apache, make test-kafka: no race detector, the broker a
// JVM of its own) the window is 20 s, and the bound is what this machine
// charges for the waits themselves, measured in the same process: 4 times
// the CPU of 32 goroutines taking turns at PerSecond by sleeping, and
// nothing else (Floor), or 5% of one core when that is more. The getrusage
// of the test process is the runner's CPU (and the client's, and
// PostgreSQL's driver's in the DB scope; the handlers of the checks make
// next to no round trips of their own, whose system calls would count
// too). A fixed bound measured the machine: the Kafka scope's check read
// 2.6 to 4.4% of one core on one 2-core test machine, and 4.5 to 6.2% on
// another, where the waits alone (Floor) cost 2.1 to 2.6%. On kfake (make
// test) the broker runs inside the test process and its CPU counts too,
// and the race detector multiplies a process's CPU several times: the
// window is 3 s and the bound 20% of one core. Either bound is far under
// the whole core a busy loop takes.
package ratecheck

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// The check's limit, its input topic and the rate's tolerance.
const (
	PerSecond  = 200.0
	Topic      = "rc-in"
	Partitions = 4
	// Tolerance is how far the measured rate may be from the limit, as
	// a fraction of it.
	Tolerance = 0.05
)

// Window is how long the check measures: 20 s on Apache Kafka, 3 s on
// the other backends (kfake under the race detector: make test).
func Window(t testing.TB) time.Duration {
	if apache(t) {
		return 20 * time.Second
	}
	return 3 * time.Second
}

// CPUBound is the share of one core the test process may use while
// limited. On Apache Kafka without the race detector it is FloorFactor
// times Floor, measured once per test binary (over FloorWindow), or 5% when
// that is more; it is 20% when the broker shares the process (kfake) or
// the race detector runs.
func CPUBound(t testing.TB) float64 {
	if apache(t) && !raceDetector {
		floorOnce.Do(func() { floor = Floor(FloorWindow) })
		b := max(0.05, FloorFactor*floor)
		t.Logf("the CPU bound: %.2f%% of one core (the waits alone: %.2f%%)", b*100, floor*100)
		return b
	}
	return 0.20
}

// FloorFactor is how many times the waits' own cost (Floor) a limited
// runner's process may use, and FloorWindow how long Floor is measured.
const (
	FloorFactor = 4.0
	FloorWindow = 5 * time.Second
)

var (
	floorOnce sync.Once
	floor     float64
)

// Floor returns the CPU, in cores, that this process spends over window
// when 32 goroutines (the checks' key-shards) take turns at PerSecond by
// sleeping until their turn, doing nothing else: what the machine charges
// for the timers and wake-ups a rate limit's waits cost.
func Floor(window time.Duration) float64 {
	var mu sync.Mutex
	var wg sync.WaitGroup
	t0 := time.Now()
	next, end := t0, t0.Add(window)
	c0 := cpuTime()
	for range 32 {
		wg.Go(func() {
			for {
				mu.Lock()
				next = next.Add(time.Duration(float64(time.Second) / PerSecond))
				at := next
				mu.Unlock()
				if at.After(end) {
					return
				}
				time.Sleep(time.Until(at)) // the wait under test, not synchronisation
			}
		})
	}
	wg.Wait()
	return float64(cpuTime()-c0) / float64(time.Since(t0))
}

func apache(t testing.TB) bool {
	kind, err := testenv.KafkaKind()
	if err != nil {
		t.Fatal(err)
	}
	return kind == "apache"
}

// CPUTime returns the process's user and system CPU time so far (its
// threads only: a broker or database it started is a process of its own).
func CPUTime(t testing.TB) time.Duration {
	c := cpuTime()
	if c < 0 {
		t.Fatal("getrusage failed")
	}
	return c
}

// cpuTime is CPUTime, -1 when getrusage fails.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Sample is what Measure saw.
type Sample struct {
	Count   int64         // what the counter counted over the window
	Elapsed time.Duration // the window, as measured
	Rate    float64       // Count a second
	CPU     float64       // the process's CPU, in cores
}

// Measure reads count and the process's CPU time, samples every 50ms
// (sample may be nil) for window, and reads them again.
func Measure(t testing.TB, window time.Duration, count func() int64, sample func()) Sample {
	t.Helper()
	n0, c0, t0 := count(), CPUTime(t), time.Now()
	for time.Since(t0) < window {
		if sample != nil {
			sample()
		}
		time.Sleep(50 * time.Millisecond) // sampling, not synchronisation
	}
	n1, c1, elapsed := count(), CPUTime(t), time.Since(t0)
	return Sample{Count: n1 - n0, Elapsed: elapsed, Rate: float64(n1-n0) / elapsed.Seconds(), CPU: float64(c1-c0) / float64(elapsed)}
}

// Within fails t unless got is within tol (a fraction) of want.
func Within(t testing.TB, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want)/want > tol {
		t.Errorf("%s: %.1f a second; want %.1f within %.0f%%", what, got, want, tol*100)
	}
}

// UnderCPUBound fails t when s's CPU is at or over CPUBound.
func UnderCPUBound(t testing.TB, s Sample) {
	t.Helper()
	underBound(t, s, CPUBound(t))
}

func underBound(t testing.TB, s Sample, b float64) {
	t.Helper()
	if s.CPU >= b {
		t.Errorf("the process used %.2f%% of one core while limited; want under %.0f%% (no busy loop)", s.CPU*100, b*100)
	}
}

// NewRunner builds a member of cfg.Group in the scope under test from
// cfg; its handler calls handled once per call.
type NewRunner func(cfg consumer.Config, handled func()) (*consumer.Runner, error)

// Run checks the rate limit of PerSecond records a second on a backlog of
// Topic (made here, of Partitions partitions, keyed over 97 keys), read
// by 32 key-shards: measured over Window once the runner has fetched
// ahead, the handler calls are at PerSecond within Tolerance, the
// process's CPU is under CPUBound, the waits are not reported as
// stalls (at most 1% of the calls see one), and Stats.RateLimit counts the waits. cfg is
// the scope's configuration (brokers, group, its options); Run sets the
// topic, the limit, the shards and the stall warning, and leaves
// CommitInterval at its default. It returns the
// runner, stopped.
func Run(t *testing.T, k *testenv.Kafka, cfg consumer.Config, newRunner NewRunner) *consumer.Runner {
	t.Helper()
	ctx := context.Background()
	window, cpuBound := Window(t), CPUBound(t)
	if err := k.CreateTopic(ctx, Topic, Partitions); err != nil {
		t.Fatal(err)
	}
	// Enough for the window and the warm-up, with records to spare: the
	// runner must never run out.
	backlog := int(PerSecond*window.Seconds()) + 2000
	recs := make([]*kgo.Record, backlog)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: Topic, Key: fmt.Appendf(nil, "k%d", i%97), Value: fmt.Appendf(nil, "v%d", i)}
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	cfg.Topics = []string{Topic}
	// The runner's default: the tests' short interval commits twenty
	// times a second, work a service does not do.
	cfg.CommitInterval = 0
	// 32 key-shards at 200 a second: each waits about 160ms for its
	// turn, past the stall warning, so a wait taken for a stall would be
	// reported at nearly every call.
	cfg.Shards = 32
	cfg.RateLimit = consumer.RateLimit{Records: consumer.Rate{PerSecond: PerSecond}}
	cfg.StallWarning = 100 * time.Millisecond
	stalls := &testenv.Stalls{}
	cfg.Hooks = append(cfg.Hooks, stalls)
	var handled atomic.Int64
	r, err := newRunner(cfg, func() { handled.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	// Measure once the runner runs limited with records fetched ahead.
	testenv.WaitFor(t, time.Minute, "the backlog fetched", func() bool {
		n := handled.Load()
		return n >= 50 && r.Stats().Polled >= n+100
	})
	stalls0 := len(stalls.All())
	s := Measure(t, window, handled.Load, nil)
	stalled := 0
	for _, st := range stalls.All()[stalls0:] {
		if !st.Ended {
			stalled++
		}
	}
	kind, _ := testenv.KafkaKind()
	t.Logf("%s, race detector %v: %d handler calls in %s: %.1f a second (limit %.0f); CPU %.2f%% of one core (bound %.0f%%); %d stalls; Stats.RateLimit %+v",
		kind, raceDetector, s.Count, s.Elapsed.Round(time.Millisecond), s.Rate, PerSecond, s.CPU*100, cpuBound*100, stalled, r.Stats().RateLimit)
	Within(t, "the handler calls", s.Rate, PerSecond, Tolerance)
	underBound(t, s, cpuBound)
	// A key-shard that its scope's own work holds past the warning (a
	// Kafka transaction's commit on a busy machine) stalls: rarely, not
	// at every call as the waits would.
	if float64(stalled) > 0.01*float64(s.Count) {
		t.Errorf("%d stalls reported over %d handler calls; a rate limit's wait is not a stall", stalled, s.Count)
	}
	if st := r.Stats().RateLimit; st.Waits == 0 || st.Waited <= 0 {
		t.Errorf("Stats.RateLimit %+v; want the waits counted", st)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	return r
}

// run runs r until the returned stop is called (by Run, or at the end of
// the test).
func run(t *testing.T, r *consumer.Runner) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			err = <-errc
		}
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}
