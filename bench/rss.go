package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kscope-dev/kscope/consumer"
)

// The child process of the peak-RSS scenario is this program re-executed
// with these variables set.
const (
	roleEnv     = "KSCOPE_BENCH_ROLE"
	roleRSS     = "rss-consumer"
	topicEnv    = "KSCOPE_BENCH_TOPIC"
	groupEnv    = "KSCOPE_BENCH_GROUP"
	slowDelay   = 5 * time.Millisecond // the slow handler's latency
	childPrefix = "rss-child: "
)

// childReport is what the child prints when it stops.
type childReport struct {
	Handled          int64 `json:"handled"`
	MaxInFlight      int64 `json:"max_in_flight"`
	MaxInFlightBytes int64 `json:"max_in_flight_bytes"`
	Pauses           int64 `json:"pauses"`
	PeakRSSKiB       int64 `json:"peak_rss_kib"` // VmHWM: the high-water mark of this process's resident set
}

// peakRSS returns the process's resident-set high-water mark (VmHWM) in KiB.
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			var kib int64
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kib)
			return kib
		}
	}
	return 0
}

// rssChild consumes the backlog with default settings and a slow handler
// until SIGTERM, then prints its counters.
func rssChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	r, err := consumer.New(consumer.Config{
		Brokers: strings.Split(os.Getenv("KAFKA_BROKERS"), ","),
		Group:   os.Getenv(groupEnv),
		Topics:  []string{os.Getenv(topicEnv)},
		Logger:  slog.New(slog.DiscardHandler),
	}, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		time.Sleep(slowDelay)
		return nil
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st := r.Stats()
	out, _ := json.Marshal(childReport{Handled: st.Done, MaxInFlight: st.MaxInFlight, MaxInFlightBytes: st.MaxInFlightBytes, Pauses: st.Pauses, PeakRSSKiB: peakRSS()})
	fmt.Println(childPrefix + string(out))
	return 0
}

// rssRun is one run of the peak-RSS scenario.
type rssRun struct {
	peakMiB   float64 // the child's VmHWM
	rusageMiB float64 // the child's rusage Maxrss: see measureRSS
	report    childReport
	for_      time.Duration
}

// measureRSS runs the consumer as a child process on the backlog for d and
// returns its peak resident set size.
//
// The peak is the child's own VmHWM, read by the child when it stops. Its
// rusage Maxrss is reported next to it but cannot be used: Go starts a
// child with clone(CLONE_VM|CLONE_VFORK), so until exec the child runs in
// the parent's address space, and Linux's exec keeps the high-water mark of
// the address space it leaves (exec_mmap → setmax_mm_hiwater_rss) in the
// child's Maxrss. That is the parent's peak: here, the in-process broker
// holding the whole backlog.
func (b *bench) measureRSS(ctx context.Context, d time.Duration) (rssRun, error) {
	self, err := os.Executable()
	if err != nil {
		return rssRun{}, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(),
		roleEnv+"="+roleRSS,
		"KAFKA_BROKERS="+strings.Join(b.k.Brokers, ","),
		topicEnv+"="+b.topic,
		groupEnv+"="+b.name("rss"),
	)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return rssRun{}, err
	}
	if err := cmd.Start(); err != nil {
		return rssRun{}, err
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		var last string
		for sc.Scan() {
			if t := sc.Text(); strings.HasPrefix(t, childPrefix) {
				last = strings.TrimPrefix(t, childPrefix)
			}
		}
		lines <- last
	}()
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	line := <-lines
	werr := cmd.Wait()
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return rssRun{}, fmt.Errorf("no rusage for the child process")
	}
	run := rssRun{rusageMiB: float64(ru.Maxrss) / 1024, for_: d} // Maxrss is in KiB on Linux
	if werr != nil {
		return run, fmt.Errorf("child consumer: %w", werr)
	}
	if err := json.Unmarshal([]byte(line), &run.report); err != nil {
		return run, fmt.Errorf("child consumer printed no report: %q", line)
	}
	if run.report.PeakRSSKiB == 0 {
		return run, fmt.Errorf("child consumer could not read its VmHWM from /proc/self/status")
	}
	run.peakMiB = float64(run.report.PeakRSSKiB) / 1024
	return run, nil
}
