// Command testkafka is `make test-kafka`: it runs kscope's suites against
// Apache Kafka started from its Maven Central artifacts (the testenv
// backend KSCOPE_KAFKA=apache) and ends with one JSON line that sums the
// run up:
//
//	{"kafka":"apache-kafka 4.4.0","brokers":1,"tests":..,"failed":0,"demo_ok":true,
//	 "reliability_lost":0,"reliability_duplicates":0,"reliability_order_violations":0,"seconds":..}
//
// It runs, one package at a time (each test starts its own broker): the
// library packages whose tests run against Kafka (among them the test kit's
// scenarios and the 3-node cluster's broker kills in internal/testenv), the
// integration module (the end-to-end suites, the kit on both scopes, and
// the short reliability matrix), and the payments demo. Progress and the
// output of failed tests go to stderr; the JSON line is the last line on
// stdout. The exit status is 1 when anything failed.
//
// Run it from the repository root: go run ./internal/testkafka.
//
// With -serve it runs no tests: it starts one Apache Kafka node on
// 127.0.0.1 (port 9092 unless -port says otherwise) and keeps it running
// until interrupted, the real-broker counterpart of `kscope dev` for trying
// the examples and the CLI (KAFKA_BROKERS=127.0.0.1:9092).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kscope-dev/kscope/internal/testenv"
)

// rootPackages are the root module's packages whose tests start a Kafka
// backend through testenv.
var rootPackages = []string{
	"./internal/testenv/",
	"./kscopetest/",
	"./consumer/",
	"./dbscope/",
	"./txn/",
	"./cmd/kscope/",
	"./kscopeotel/",
	"./kscopeprom/",
	"./health/",
}

// goCmd is the go command the tests and the demo run with.
var goCmd string

// summary is the JSON line the run ends with.
type summary struct {
	Kafka       string `json:"kafka"`
	Brokers     int    `json:"brokers"`
	Tests       int    `json:"tests"`
	Failed      int    `json:"failed"`
	Skipped     int    `json:"skipped"`
	DemoOK      bool   `json:"demo_ok"`
	RelLost     int    `json:"reliability_lost"`
	RelDups     int    `json:"reliability_duplicates"`
	RelOrder    int    `json:"reliability_order_violations"`
	RelFailed   int    `json:"reliability_failed_scenarios"`
	RelScenario int    `json:"reliability_scenarios"`
	// BrokerKills counts the reliability scenarios that SIGKILL brokers
	// of their own clusters (one node, and three nodes with replication
	// factor 3); ClusterBrokers is the largest of those clusters.
	BrokerKills    int     `json:"broker_kill_scenarios"`
	ClusterBrokers int     `json:"cluster_brokers"`
	Seconds        float64 `json:"seconds"`
}

func main() {
	timeout := flag.Duration("timeout", 30*time.Minute, "go test -timeout, per module")
	run := flag.String("run", "", "go test -run, to run some tests only")
	serveMode := flag.Bool("serve", false, "run no tests: serve one Apache Kafka node until interrupted")
	port := flag.Int("port", 9092, "with -serve, the broker port")
	flag.StringVar(&goCmd, "go", "go", "the go command")
	flag.Parse()
	if *serveMode {
		if err := serve(*port); err != nil {
			fmt.Fprintln(os.Stderr, "test-kafka:", err)
			os.Exit(1)
		}
		return
	}
	start := time.Now()
	s, err := testKafka(*timeout, *run)
	s.Seconds = time.Since(start).Round(100 * time.Millisecond).Seconds()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test-kafka:", err)
	}
	line, _ := json.Marshal(s)
	fmt.Println(string(line))
	if err != nil || s.Failed > 0 || !s.DemoOK || s.RelLost+s.RelDups+s.RelOrder+s.RelFailed > 0 || s.RelScenario == 0 {
		os.Exit(1)
	}
}

func testKafka(timeout time.Duration, run string) (summary, error) {
	s := summary{Kafka: "apache-kafka " + testenv.ApacheKafkaVersion, Brokers: 1}
	env := apacheEnv()

	// Resolve the artifacts once, up front, so that the time a first run
	// spends downloading is shown apart.
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	cp, err := testenv.ApacheKafkaClasspath(ctx)
	cancel()
	if err != nil {
		return s, err
	}
	fmt.Fprintf(os.Stderr, "test-kafka: Apache Kafka %s on %s (classpath ready in %.1fs)\n",
		testenv.ApacheKafkaVersion, filepath.Dir(cp), time.Since(t0).Seconds())

	args := []string{"test", "-json", "-count=1", "-timeout", timeout.String()}
	if run != "" {
		args = append(args, "-run", run)
	}
	var errs []error
	var rel []relSummary
	for _, step := range []struct {
		dir      string
		pkgs     []string
		parallel string
	}{
		// One package at a time: every test starts a broker of its own,
		// and two packages at once (two JVMs starting on two cores) took
		// as long as one after the other.
		{".", rootPackages, "1"},
		{"integration", []string{"./..."}, "1"},
	} {
		r, err := goTestJSON(step.dir, env, append(append([]string(nil), args...), append([]string{"-p", step.parallel}, step.pkgs...)...))
		s.Tests += r.passed + r.failed
		s.Failed += r.failed
		s.Skipped += r.skipped
		rel = append(rel, r.reliability...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range rel {
		s.RelScenario += r.Scenarios
		s.RelLost += r.Lost
		s.RelDups += r.DupEffects + r.DupOutputs
		s.RelOrder += r.OrderBroken
		s.RelFailed += r.Failed
		s.BrokerKills += r.ApacheKafka
		s.ClusterBrokers = max(s.ClusterBrokers, r.ApacheNodes)
	}
	if run == "" && len(rel) == 0 {
		errs = append(errs, errors.New("the reliability suite printed no summary line"))
	}

	if run == "" {
		ok, err := demo(env)
		s.DemoOK = ok
		if err != nil {
			errs = append(errs, err)
		}
	}
	return s, errors.Join(errs...)
}

// serve starts one Apache Kafka node on port and stops it on SIGINT or
// SIGTERM.
func serve(port int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	k, err := testenv.StartApacheKafka(ctx, testenv.ApacheOptions{Port: port})
	if err != nil {
		return err
	}
	defer k.Close()
	fmt.Printf("Apache Kafka %s (KRaft, one node) serving; logs in %s\nexport KAFKA_BROKERS=%s\n",
		testenv.ApacheKafkaVersion, k.Apache.Dir, strings.Join(k.Brokers, ","))
	<-ctx.Done()
	return nil
}

// apacheEnv is this process's environment with the Apache Kafka backend
// selected and the other selections removed.
func apacheEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "KAFKA_BROKERS", "KSCOPE_TEST_CONTAINERS", testenv.KafkaEnv:
			continue
		}
		env = append(env, kv)
	}
	return append(env, testenv.KafkaEnv+"=apache")
}

// testEvent is one line of go test -json (cmd/test2json).
type testEvent struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// relSummary is the JSON line the integration module's reliability suite
// prints at its end (integration/reliability_test.go).
type relSummary struct {
	Scenarios   int `json:"scenarios"`
	Lost        int `json:"lost"`
	DupEffects  int `json:"duplicate_effects"`
	DupOutputs  int `json:"duplicate_outputs"`
	OrderBroken int `json:"order_violations"`
	Failed      int `json:"failed_scenarios"`
	ApacheKafka int `json:"apache_kafka"`
	ApacheNodes int `json:"apache_kafka_nodes"`
}

type testResult struct {
	passed, failed, skipped int
	reliability             []relSummary
}

// goTestJSON runs go test -json in dir and tallies the tests (subtests
// included). It reports each finished top-level test on stderr, with the
// output of those that failed.
func goTestJSON(dir string, env, args []string) (testResult, error) {
	cmd := exec.Command(goCmd, args...)
	cmd.Dir, cmd.Env = dir, env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return testResult{}, err
	}
	fmt.Fprintf(os.Stderr, "test-kafka: (cd %s && %s %s)\n", dir, goCmd, strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		return testResult{}, err
	}
	t := &tally{output: map[string][]string{}, failedPkgs: map[string]bool{}, pkgFailedTests: map[string]int{}}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev testEvent
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		t.add(ev)
	}
	io.Copy(io.Discard, out)
	werr := cmd.Wait()
	r := t.finish()
	if werr != nil && len(t.failedPkgs) == 0 && r.failed == 0 {
		return r, fmt.Errorf("go test in %s: %v\n%s", dir, werr, stderr.String())
	}
	if stderr.Len() > 0 {
		fmt.Fprint(os.Stderr, stderr.String())
	}
	return r, nil
}

// tally counts the events of one go test -json run, and reports each
// finished package and top-level test on stderr.
type tally struct {
	r              testResult
	output         map[string][]string // package/test -> output lines
	failedPkgs     map[string]bool
	pkgFailedTests map[string]int
}

// add takes one event of the run.
func (t *tally) add(ev testEvent) {
	key := ev.Package + " " + ev.Test
	switch ev.Action {
	case "output":
		t.output[key] = append(t.output[key], ev.Output)
		if ev.Test == "" && strings.HasPrefix(ev.Output, `{"scenarios":`) {
			var rs relSummary
			if json.Unmarshal([]byte(ev.Output), &rs) == nil {
				t.r.reliability = append(t.r.reliability, rs)
			}
		}
	case "pass", "fail", "skip":
		if ev.Test == "" {
			t.packageDone(ev, key)
			return
		}
		t.testDone(ev, key)
	}
}

// packageDone reports a package's end, with its output when it failed.
func (t *tally) packageDone(ev testEvent, key string) {
	if ev.Action == "fail" {
		t.failedPkgs[ev.Package] = true
		fmt.Fprintf(os.Stderr, "FAIL %s (%.1fs)\n%s", ev.Package, ev.Elapsed, strings.Join(t.output[key], ""))
	} else {
		fmt.Fprintf(os.Stderr, "%-4s %s (%.1fs)\n", strings.ToUpper(ev.Action), ev.Package, ev.Elapsed)
	}
}

// testDone counts a test's end, and reports a top-level test's, with the
// output of it and its subtests when it failed. The output of a test that
// did not fail is dropped.
func (t *tally) testDone(ev testEvent, key string) {
	switch ev.Action {
	case "pass":
		t.r.passed++
	case "fail":
		t.r.failed++
		t.pkgFailedTests[ev.Package]++
	case "skip":
		t.r.skipped++
	}
	if !strings.Contains(ev.Test, "/") {
		fmt.Fprintf(os.Stderr, "  %-4s %s (%.1fs)\n", strings.ToUpper(ev.Action), ev.Test, ev.Elapsed)
		if ev.Action == "fail" {
			for k, lines := range t.output {
				if k == key || strings.HasPrefix(k, key+"/") {
					fmt.Fprint(os.Stderr, strings.Join(lines, ""))
				}
			}
		}
	}
	if ev.Action != "fail" {
		delete(t.output, key)
	}
}

// finish returns the counts once the run ended: a package that failed
// without a failed test (a build error, a panic, a timeout, TestMain's own
// verdict) counts as one failed test.
func (t *tally) finish() testResult {
	for p := range t.failedPkgs {
		if t.pkgFailedTests[p] == 0 {
			t.r.failed++
		}
	}
	return t.r
}

// demo runs the payments demo (make demo) on the Apache Kafka backend and
// reports whether its JSON line says "ok":true.
func demo(env []string) (bool, error) {
	fmt.Fprintln(os.Stderr, "test-kafka: go run ./examples/payments")
	cmd := exec.Command(goCmd, "run", "./examples/payments")
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(&out, os.Stderr)
	cmd.Stderr = os.Stderr
	runErr := cmd.Run()
	var last string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if strings.HasPrefix(l, "{") {
			last = l
		}
	}
	var rep struct {
		OK *bool `json:"ok"`
	}
	if last == "" || json.Unmarshal([]byte(last), &rep) != nil || rep.OK == nil {
		return false, fmt.Errorf("the payments demo printed no JSON report (exit: %v)", runErr)
	}
	if runErr != nil && *rep.OK {
		return false, fmt.Errorf("the payments demo reported ok but exited with %v", runErr)
	}
	return *rep.OK, nil
}
