package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// A child consumer is this test binary started again with childRoleEnv set:
// it consumes with the configuration in its environment and reports every
// record it handled as a line "REC <value>" on stdout, written before the
// handler returns (so before the offset can be committed).
const (
	childRoleEnv   = "KSCOPE_CHILD_ROLE"
	childGroupEnv  = "KSCOPE_CHILD_GROUP"
	childTopicEnv  = "KSCOPE_CHILD_TOPIC"
	childDelayEnv  = "KSCOPE_CHILD_MAX_DELAY"
	childCommitEnv = "KSCOPE_CHILD_COMMIT_INTERVAL"
	statsLinePref  = "STATS "
	readyLine      = "READY"
	recordLinePref = "REC "
	failLinePref   = "FAIL " // a handler call that returned a failure (roles that report them)
)

// childClientOptions make a killed child's group membership expire quickly,
// so its partitions move on within a second or so.
func childClientOptions() []kgo.Opt {
	return []kgo.Opt{kgo.SessionTimeout(time.Second), kgo.HeartbeatInterval(100 * time.Millisecond)}
}

// childLogLevel is the level of a child's log: warnings, or the level
// KSCOPE_CHILD_LOG names (debug, info), to follow a scenario's
// rebalances when it is looped to find a rare failure.
func childLogLevel() slog.Level {
	var l slog.Level = slog.LevelWarn
	if v := os.Getenv("KSCOPE_CHILD_LOG"); v != "" && l.UnmarshalText([]byte(v)) != nil {
		l = slog.LevelWarn
	}
	return l
}

func runChild(role string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fmt.Println(readyLine) // SIGTERM is handled from here on
	maxDelay, _ := time.ParseDuration(os.Getenv(childDelayEnv))
	var outMu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	say := func(pref string, v []byte) {
		outMu.Lock()
		defer outMu.Unlock()
		out.WriteString(pref)
		out.Write(v)
		out.WriteByte('\n')
		out.Flush()
	}
	emit := func(v []byte) { say(recordLinePref, v) }
	watchState(say)
	commitEvery := 20 * time.Millisecond
	if v := os.Getenv(childCommitEnv); v != "" {
		commitEvery, _ = time.ParseDuration(v)
	}
	cfg := consumer.Config{
		Brokers:        strings.Split(os.Getenv("KAFKA_BROKERS"), ","),
		Group:          os.Getenv(childGroupEnv),
		Topics:         []string{os.Getenv(childTopicEnv)},
		Shards:         8,
		CommitInterval: commitEvery,
		DrainTimeout:   5 * time.Second,
		// A member killed while its JoinGroup waits at the broker can
		// hold the next rebalance until the rebalance timeout (kfake
		// counts it as joining); 10s bounds that stall in every
		// scenario that kills children.
		RebalanceTimeout: 10 * time.Second,
		ClientOptions:    append(childClientOptions(), kgo.ClientID(childClientID(os.Getpid()))),
		GroupProtocol:    consumer.GroupProtocol(testenv.GroupProtocol()),
		Logger:           slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: childLogLevel()})),
	}
	var h consumer.Handler
	switch role {
	case "db", "db-offsets":
		return runDBChild(ctx, cfg, role == "db-offsets", maxDelay, emit)
	case "db-ordered":
		cfg.Failures = orderedChildPolicy()
		return runDBChildFailing(ctx, cfg, false, maxDelay, emit, failsTwice)
	case "db-midroute-park", "db-midroute", "db-midroute-unordered":
		cfg.Failures = midRouteChildPolicy(role == "db-midroute-unordered")
		return runDBChildFailing(ctx, cfg, false, maxDelay, emit, func(r *consumer.Record) bool {
			if failsMidRoute(role, r) {
				say(failLinePref, r.Value)
				return true
			}
			return false
		})
	case "outbox-relay":
		return runRelayChild(ctx)
	case "db-intent":
		return runIntentChild(ctx, cfg, maxDelay, emit)
	case "txn", "txn-versions", "txn-dedupe":
		return runTxnChild(ctx, cfg, maxDelay, role)
	case "db-share", "alo-share":
		return runShareChild(ctx, cfg, role == "db-share", maxDelay, emit)
	case "alo-dedupe":
		return runDedupeChild(ctx, cfg, maxDelay, emit, say)
	case "db-breaker", "txn-breaker":
		return runBreakerChild(ctx, cfg, role == "db-breaker", maxDelay, emit, say)
	case "at-least-once":
		h = consumer.HandlerFunc(func(ctx context.Context, r *consumer.Record) error {
			if maxDelay > 0 {
				time.Sleep(rand.N(maxDelay))
			}
			emit(r.Value)
			return nil
		})
	default:
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
		return 2
	}
	r, err := consumer.New(cfg, h)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	childRunner.Store(r)
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// child is a running child consumer process.
type child struct {
	k      *testenv.Kafka
	group  string
	cmd    *exec.Cmd
	exited chan struct{}
	ready  chan struct{} // closed once the child handles SIGTERM
	err    error
	stats  string        // the STATS line a child prints on a graceful exit
	failed chan struct{} // closed at the child's first FAIL line
	stated chan struct{} // signalled at each STATE line
	events childEvents   // its EVENT lines (roles that print them)
	// remembered are the identities its dedupe store acknowledged
	// (MEM lines, role alo-dedupe).
	remembered childEvents
}

// startChild starts a child consumer whose record lines go to onRecord.
func startChild(t *testing.T, k *testenv.Kafka, role, group, topic string, maxDelay time.Duration, onRecord func([]byte), extraEnv ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), extraEnv...),
		childRoleEnv+"="+role,
		"KAFKA_BROKERS="+strings.Join(k.Brokers, ","),
		childGroupEnv+"="+group,
		childTopicEnv+"="+topic,
		childDelayEnv+"="+maxDelay.String(),
	)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &prefixWriter{t: t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{k: k, group: group, cmd: cmd, exited: make(chan struct{}), ready: make(chan struct{}), failed: make(chan struct{}), stated: make(chan struct{}, 1)}
	failed := false
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == readyLine {
				close(c.ready)
			} else if v, ok := strings.CutPrefix(sc.Text(), recordLinePref); ok {
				onRecord([]byte(v))
			} else if v, ok := strings.CutPrefix(sc.Text(), statsLinePref); ok {
				c.stats = v
			} else if v, ok := strings.CutPrefix(sc.Text(), eventLinePref); ok {
				c.events.add(v)
			} else if v, ok := strings.CutPrefix(sc.Text(), memLinePref); ok {
				c.remembered.add(v)
			} else if v, ok := strings.CutPrefix(sc.Text(), stateLinePref); ok {
				t.Logf("child %d state: %s", cmd.Process.Pid, v)
				select {
				case c.stated <- struct{}{}:
				default:
				}
			} else if strings.HasPrefix(sc.Text(), failLinePref) && !failed {
				failed = true
				close(c.failed)
			}
		}
		io.Copy(io.Discard, stdout)
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			c.dump()
		}
		c.kill()
	})
	return c
}

// dump asks a child still running for its runner's state (SIGUSR1: a
// STATE line, which the test logs), then for its goroutines' stacks
// (SIGQUIT: the Go runtime writes them to stderr, which the test logs, and
// exits), so that a test that fails shows what each live member held and
// was doing.
func (c *child) dump() {
	select {
	case <-c.exited:
		return
	default:
	}
	select {
	case <-c.ready: // SIGUSR1 is watched from here on
	case <-time.After(5 * time.Second):
	}
	c.cmd.Process.Signal(syscall.SIGUSR1)
	select {
	case <-c.stated:
	case <-c.exited:
		return
	case <-time.After(5 * time.Second):
	}
	c.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
	}
}

// kill sends SIGKILL and waits until the process is gone and its output read
// to the end.
func (c *child) kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
	c.k.Departed(c.group, childClientID(c.cmd.Process.Pid))
}

// childClientID is the Kafka client ID of the child with this process ID:
// the group's member of a killed child is found by it (Kafka.Departed).
func childClientID(pid int) string { return fmt.Sprintf("kscope-child-%d", pid) }

// terminate sends SIGTERM (a graceful stop) and returns the exit error.
func (c *child) terminate(t *testing.T) error {
	t.Helper()
	select {
	case <-c.ready:
	case <-c.exited:
		return c.err
	case <-time.After(time.Minute):
		t.Fatal("child never became ready")
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
		return c.err
	case <-time.After(time.Minute):
		t.Fatal("child did not exit within a minute of SIGTERM")
		return nil
	}
}

type prefixWriter struct{ t *testing.T }

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.t.Logf("child: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
