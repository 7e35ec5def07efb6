package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/internal/testenv"
)

// kscopeBinary builds the kscope command into a directory of the test's,
// and returns its path.
func kscopeBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kscope")
	goCmd := "go"
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			goCmd = p
		}
	}
	if out, err := exec.Command(goCmd, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building kscope: %v\n%s", err, out)
	}
	return bin
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// kscopeBin runs the built kscope binary bin with args, in an environment
// without KSCOPE_POLICY, plus env.
func kscopeBin(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, policyEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running kscope: %v", err)
	}
	return result{code, out.String(), errb.String()}
}

// writePolicy writes a policy file and returns its path.
func writePolicy(t *testing.T, src string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kscope-policy.yaml")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const billingPolicy = `version: 1
consumers:
  - group: billing
    scope: db
    owner: {team: billing, contact: "#billing-oncall"}
    replay: false
  - group: reports
    scope: at_least_once
    owner: {team: analytics, contact: analytics@example.com}
    replay: true
    dedupe: redis
    dead_letter: {retention: 168h}
    lag_objective: {p95_seconds: 600}
`

func TestPolicyCheck(t *testing.T) {
	bin := kscopeBinary(t)
	good := writePolicy(t, billingPolicy)
	r := kscopeBin(t, bin, nil, "policy", "check", good)
	r.want(t, exitOK, good+": valid, 2 consumer groups", "GROUP", "DEDUPE", "billing", "db", "billing (#billing-oncall)", "refused  inbox", "2m0s", "billing.kscope-dlt (retention unlimited)",
		"reports", "at_least_once", "allowed  redis", "10m0s", "reports.kscope-dlt (retention 168h0m0s)")
	// The file from the global flag, or from the environment.
	kscopeBin(t, bin, nil, "--policy", good, "policy", "check").want(t, exitOK, "valid, 2 consumer groups")
	kscopeBin(t, bin, []string{policyEnv + "=" + good}, "policy", "check").want(t, exitOK, "valid, 2 consumer groups")

	bad := writePolicy(t, strings.Replace(strings.Replace(billingPolicy, "scope: db", "scope: DB", 1), "replay: true\n", "replay: true\n    failures: {ladder: [1m, 5s], retrys: 3}\n", 1))
	r = kscopeBin(t, bin, nil, "policy", "check", bad)
	r.want(t, exitRefused, "kscope policy check: the policy file "+bad+" is not valid (1 problem); nothing was done",
		bad+`:11: consumer reports: failures.retrys: "retrys" is not a field here`)
	// Once it decodes, every check: both problems at once.
	bad = writePolicy(t, strings.Replace(strings.Replace(billingPolicy, "scope: db", "scope: DB", 1), "replay: true\n", "replay: true\n    failures: {ladder: [1m, 5s]}\n", 1))
	r = kscopeBin(t, bin, nil, "policy", "check", bad)
	r.want(t, exitRefused, "(2 problems)", bad+`:4: consumer billing: scope: "DB" is not a scope; use at_least_once, db, kafka`,
		bad+":11: consumer reports: failures.ladder: delays must increase, got 1m0s then 5s")
	if r.stdout != "" {
		t.Fatalf("an invalid file printed on stdout:\n%s", r.stdout)
	}

	kscopeBin(t, bin, nil, "policy", "check").want(t, exitUsage, "give the policy file")
	kscopeBin(t, bin, nil, "policy", "check", filepath.Join(t.TempDir(), "nope.yaml")).want(t, exitRefused, "nope.yaml: no such file", "check --policy or KSCOPE_POLICY")
	kscopeBin(t, bin, nil, "--policy").want(t, exitUsage, "--policy needs a file")
	kscopeBin(t, bin, nil, "policy").want(t, exitUsage, "kscope policy check", "kscope policy schema")

	r = kscopeBin(t, bin, nil, "policy", "schema")
	var schema map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &schema); err != nil || schema["title"] != "kscope consumer policy" {
		t.Fatalf("policy schema: %v\n%s", err, r.stdout)
	}
}

// A consumer group whose policy says replay: false is refused, with exit
// status 2 and a sentence that says why, before anything is read or
// changed; another group in the file, or one the file does not list, is
// replayed.
func TestReplayRefusedByPolicy(t *testing.T) {
	bin := kscopeBinary(t)
	k := testenv.KafkaT(t)
	setupReplay(t, k)
	commit(t, k, "reports", map[int32]int64{0: 8, 1: 6})
	commit(t, k, "unlisted", map[int32]int64{0: 8, 1: 6})
	file := writePolicy(t, billingPolicy)
	why := "kscope replay: refused: the policy " + file + " says replay: false for consumer group billing (db scope, owned by billing, #billing-oncall): its effects must not run again, so its offsets are not moved; nothing was changed"

	for _, run := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"--policy", file, "replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-start", "--yes"}},
		{nil, []string{"replay", "--policy=" + file, brokers(k), "--group", "billing", "--topic", testSource, "--to-start", "--yes"}},
		{[]string{policyEnv + "=" + file}, []string{"replay", brokers(k), "--group", "billing", "--topic", testSource, "--to-start", "--dry-run"}},
		// Refused before the brokers are needed.
		{[]string{policyEnv + "=" + file, "KAFKA_BROKERS="}, []string{"replay", "--group", "billing", "--topic", testSource, "--to-start", "--yes"}},
	} {
		r := kscopeBin(t, bin, run.env, run.args...)
		r.want(t, exitRefused, why, "ask the owner to set replay: true")
		if strings.Contains(r.stdout, "PARTITION") {
			t.Fatalf("printed a plan for a refused group:\n%s", r.stdout)
		}
	}
	if got := committed(t, k, "billing"); got != "0:8 1:6" {
		t.Fatalf("the refused replay moved the offsets: %s", got)
	}

	r := kscopeBin(t, bin, nil, "--policy", file, "replay", brokers(k), "--group", "reports", "--topic", testSource, "--to-start", "--yes")
	r.want(t, exitOK, "policy "+file+": consumer group reports (at_least_once scope, owned by analytics, analytics@example.com) allows a replay", "committed")
	if got := committed(t, k, "reports"); got != "0:0 1:0" {
		t.Fatalf("the allowed replay: %s", got)
	}
	r = kscopeBin(t, bin, []string{policyEnv + "=" + file}, "replay", brokers(k), "--group", "unlisted", "--topic", testSource, "--to-start", "--json")
	r.want(t, exitOK)
	var rep struct {
		Policy string `json:"policy"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || !strings.Contains(rep.Policy, "no entry for consumer group unlisted") {
		t.Fatalf("--json: %v %+v\n%s", err, rep, r.stdout)
	}

	// A policy file that is not valid stops the replay, whatever group.
	bad := writePolicy(t, "version: 1\nconsumers:\n  - group: reports\n")
	kscopeBin(t, bin, nil, "--policy", bad, "replay", brokers(k), "--group", "reports", "--topic", testSource, "--to-start", "--yes").
		want(t, exitRefused, "the policy file "+bad+" is not valid (3 problems)", "replay: missing")
}

// The global flag and the help texts, in process.
func TestPolicyFlagInHelp(t *testing.T) {
	kscope(t, "help").want(t, exitOK, "--policy FILE", "KSCOPE_POLICY", "policy check")
	kscope(t, "replay", "-h").want(t, exitOK, "--policy file", "replay: false")
	kscope(t, "help", "policy", "check").want(t, exitOK, "kscope policy check [FILE]", "exit 2")
	kscope(t, "--policy=x.yaml", "frobnicate").want(t, exitUsage, `unknown command "frobnicate"`)
}

// kscope policy rules prints the series kscope's alerts read, one
// kscope_pipeline_info and one lag objective per consumer group, as a rule
// file promtool accepts, and the alerts page on the right groups with it.
func TestPolicyRules(t *testing.T) {
	bin := kscopeBinary(t)
	good := writePolicy(t, strings.Replace(billingPolicy, "replay: false\n", "replay: false\n    critical: true\n", 1))
	r := kscopeBin(t, bin, nil, "policy", "rules", good)
	r.want(t, exitOK, "record: kscope_pipeline_info", `consumer_group: "billing"`, `critical: "true"`, `team: "billing"`, `scope: "db"`,
		`consumer_group: "reports"`, `critical: "false"`, "record: kscope_pipeline_lag_objective_seconds", "expr: vector(120)", "expr: vector(600)")
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed (Debian: apt-get install prometheus); .ci/run installs it")
	}
	rules := filepath.Join(t.TempDir(), "pipelines.yml")
	if err := os.WriteFile(rules, []byte(r.stdout), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", rules).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	kscopeBin(t, bin, nil, "policy", "rules").want(t, exitUsage, "give the policy file")
}
