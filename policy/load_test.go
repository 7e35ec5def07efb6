package policy_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/policy"
)

func TestLoadReadsEveryField(t *testing.T) {
	f, err := policy.Load("testdata/service.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if f.Path() != "testdata/service.yaml" || len(f.Consumers) != 2 {
		t.Fatalf("path %q, %d consumers", f.Path(), len(f.Consumers))
	}
	c, ok := f.Consumer("payments-ledger")
	if !ok {
		t.Fatal("payments-ledger not found")
	}
	if c.Scope != policy.ScopeDB || c.Owner.Team != "payments" || c.Owner.Contact != "#payments-oncall" || !c.Replay || c.File() != "testdata/service.yaml" {
		t.Fatalf("entry: %+v", c)
	}
	fl := c.Failures
	if fl.Backoff.Std() != 200*time.Millisecond || fl.MaxBackoff.Std() != 10*time.Second || fl.InPlaceAttempts != 2 ||
		fl.RetryableAttempts != 9 || fl.UnknownAttempts != 4 || !slices.Equal(fl.Ladder, []policy.Duration{policy.Duration(5 * time.Second), policy.Duration(time.Minute)}) {
		t.Fatalf("failures: %+v", fl)
	}
	if c.DeadLetter.Topic != "payments-ledger.dlt" || c.DeadLetter.Retention.Std() != 720*time.Hour || c.LagP95() != time.Minute {
		t.Fatalf("dead letter %+v, lag %s", c.DeadLetter, c.LagP95())
	}
	if g := c.Gaps; g.Policy != policy.GapDeadLetter || g.First != policy.FirstMustBeOne || g.Header != "account-version" {
		t.Fatalf("gaps: %+v", g)
	}
	charger, _ := f.Consumer("card-charger")
	if charger.Replay || charger.Scope != policy.ScopeAtLeastOnce || !charger.Failures.DisableRetryTopics || charger.LagP95() != policy.DefaultLagObjective {
		t.Fatalf("card-charger: %+v", charger)
	}
	if _, ok := f.Consumer("nobody"); ok {
		t.Fatal("found an entry for a group the file does not list")
	}
}

// problems parses src as file "svc.yaml" and returns its problems' lines.
func problems(t *testing.T, src string) []string {
	t.Helper()
	_, err := policy.Parse("svc.yaml", []byte(src))
	var pe *policy.Error
	if !errors.As(err, &pe) {
		t.Fatalf("want an *Error, got %v", err)
	}
	var out []string
	for _, p := range pe.Problems {
		out = append(out, p.Error())
	}
	return out
}

// wantProblem fails unless one of got contains every one of subs.
func wantProblem(t *testing.T, got []string, subs ...string) {
	t.Helper()
	for _, g := range got {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(g, s)
		}
		if ok {
			return
		}
	}
	t.Fatalf("no problem contains %q; got:\n%s", subs, strings.Join(got, "\n"))
}

const head = "version: 1\nconsumers:\n"

// Decoding is strict, and each problem names the file, the line, the
// consumer, the field and the fix.
func TestStrictDecoding(t *testing.T) {
	got := problems(t, head+`  - group: ledger
    scope: db
    owner: {team: pay, contact: x}
    replay: true
    failures:
      backof: 1s
`)
	wantProblem(t, got, "svc.yaml:8: consumer ledger: failures.backof:", `"backof" is not a field here`, "backoff, max_backoff")

	got = problems(t, head+`  - group: ledger
    scope: db
    owner: {team: pay, contact: x}
    replay: yes please
    lag_objective: {p95_seconds: soon}
`)
	wantProblem(t, got, "svc.yaml:6: consumer ledger: replay:", "is not true or false")
	wantProblem(t, got, "svc.yaml:7: consumer ledger: lag_objective.p95_seconds:", `"soon" is not an integer`, "a whole number")

	got = problems(t, head+`  - group: ledger
    scope: db
    owner: {team: pay, contact: x}
    replay: true
    failures: {backoff: 5, ladder: [1m, soon]}
`)
	wantProblem(t, got, "svc.yaml:7: consumer ledger: failures.backoff", "5 is a number without a unit", "5s")
	wantProblem(t, got, "svc.yaml:7", `"soon" is not a duration`, "1m30s")

	got = problems(t, "version: 1\nextra: 2\nconsumers: []\n")
	wantProblem(t, got, "svc.yaml:2: extra:", `"extra" is not a field here`, "version, consumers")
}

func TestMissingRequiredFields(t *testing.T) {
	got := problems(t, head+`  - group: ledger
    scope: db
    owner: {team: pay}
`)
	wantProblem(t, got, "svc.yaml:3: consumer ledger: replay: missing", "replay: false when its effects must never run again")
	wantProblem(t, got, "consumer ledger: owner.contact: missing", "how to reach the owning team")

	got = problems(t, "consumers:\n  - scope: db\n")
	wantProblem(t, got, "svc.yaml:1: version: missing", "add version: 1")
	wantProblem(t, got, "svc.yaml:2: consumer consumers[0]: group: missing")

	wantProblem(t, problems(t, ""), "svc.yaml: the file is empty")
	wantProblem(t, problems(t, "version: 1\nconsumers: [\n"), "svc.yaml:", "fix the YAML")
	wantProblem(t, problems(t, head+"  - group: a\n---\nversion: 1\n"), "more than one YAML document")
	wantProblem(t, problems(t, "version: 1\nversion: 1\nconsumers: []\n"), "already defined")
}

// The checks of the library's own configuration run on the file, under
// the file's names.
func TestValidation(t *testing.T) {
	entry := func(body string) string {
		return head + "  - group: ledger\n    scope: db\n    owner: {team: pay, contact: x}\n    replay: true\n" + body
	}
	for _, tc := range []struct {
		src  string
		want []string
	}{
		{entry("    failures: {ladder: [1m, 5s]}\n"), []string{"svc.yaml:7: consumer ledger: failures.ladder: delays must increase, got 1m0s then 5s"}},
		{entry("    failures: {ladder: []}\n"), []string{"failures.ladder: is empty", "disable_retry_topics: true"}},
		{entry("    failures:\n      backoff: 2m\n      max_backoff: 1m\n"), []string{"svc.yaml:9: consumer ledger: failures.max_backoff: is 1m0s, below backoff (2m0s); raise it or lower backoff"}},
		{entry("    failures: {unknown_attempts: -1}\n"), []string{"failures.unknown_attempts: is -1; set it between 1 and"}},
		{entry("    dead_letter: {topic: 'bad topic'}\n"), []string{"svc.yaml:7: consumer ledger: dead_letter.topic:", "not a valid topic name"}},
		{entry("    dead_letter: {topic: ledger.kscope-retry-5s}\n"), []string{"dead_letter.topic:", "retry topics", "default ledger.kscope-dlt"}},
		{entry("    dead_letter: {retention: -1h}\n"), []string{"dead_letter.retention: is -1h0m0s"}},
		{entry("    lag_objective: {p95_seconds: 0}\n"), []string{"lag_objective.p95_seconds: is 0", "default, 120"}},
		{entry("    gaps: {policy: drop}\n"), []string{"svc.yaml:7: consumer ledger: gaps.policy: \"drop\" is not a gap policy; use wait, dead_letter, accept"}},
		{entry("    gaps: {policy: accept, timeout: 1m}\n"), []string{"gaps.timeout: bounds a wait"}},
		{entry("    gaps: {policy: wait, first: 1}\n"), []string{"gaps.first: \"1\" is not a first-version policy; use any or one"}},
		{entry("    gaps: {policy: wait, on_timeout: skip}\n"), []string{"gaps.on_timeout: \"skip\" is not a timeout policy; use dead_letter or accept"}},
		{entry("    gaps: {policy: dead_letter, on_timeout: accept}\n"), []string{"gaps.on_timeout: says what becomes of a record that waited, and the policy is dead_letter"}},
		{head + "  - {group: a, scope: at_least_once, owner: {team: t, contact: c}, replay: true, gaps: {policy: wait}}\n", []string{"consumer a: gaps: the at_least_once scope checks no versions"}},
		{entry("    dedupe: redis\n"), []string{"svc.yaml:7: consumer ledger: dedupe: the db scope dedupes by itself (its inbox); remove dedupe"}},
		{head + "  - {group: a, scope: at_least_once, owner: {team: t, contact: c}, replay: true, dedupe: disk}\n", []string{"svc.yaml:3: consumer a: dedupe: \"disk\" is not a dedupe store; use redis, postgres, memory, none"}},
		{head + "  - {group: a, scope: DB, owner: {team: t, contact: c}, replay: true}\n", []string{"svc.yaml:3: consumer a: scope: \"DB\" is not a scope; use at_least_once, db, kafka"}},
		{head + "  - {group: a, scope: db, owner: {team: '', contact: c}, replay: true}\n  - {group: a, scope: db, owner: {team: t, contact: c}, replay: true}\n",
			[]string{"consumer a: owner.team: is empty", "svc.yaml:4: consumer a: group: is listed twice (also entry 0, line 3)"}},
		{"version: 2\nconsumers: []\n", []string{"svc.yaml:1: version: is 2; this kscope reads version 1", "svc.yaml:2: consumers: lists no consumer group"}},
	} {
		got := problems(t, tc.src)
		for _, w := range tc.want {
			wantProblem(t, got, w)
		}
	}
}

// A File built in code is checked the same way, without lines.
func TestValidateAFileBuiltInCode(t *testing.T) {
	c := policy.Consumer{Group: "a", Scope: policy.ScopeDB, Owner: policy.Owner{Team: "t", Contact: "c"}}
	if err := (&policy.File{Version: 1, Consumers: []policy.Consumer{c}}).Validate(); err != nil {
		t.Fatal(err)
	}
	err := (&policy.File{Version: 1, Consumers: []policy.Consumer{c, c}}).Validate()
	if err == nil || err.Error() != "policy: consumer a: group: is listed twice (also entry 0); keep one entry per consumer group" {
		t.Fatalf("got %v", err)
	}
}

// Only a store that outlives the consumer's processes dedupes what a
// replay gives an at_least_once consumer again; the other scopes dedupe by
// themselves.
func TestReplayDeduped(t *testing.T) {
	for _, tc := range []struct {
		scope  policy.Scope
		dedupe policy.DedupeStore
		want   bool
	}{
		{policy.ScopeAtLeastOnce, policy.DedupeRedis, true},
		{policy.ScopeAtLeastOnce, policy.DedupePostgres, true},
		{policy.ScopeAtLeastOnce, policy.DedupeMemory, false},
		{policy.ScopeAtLeastOnce, policy.DedupeNone, false},
		{policy.ScopeAtLeastOnce, "", false},
		{policy.ScopeDB, "", true},
		{policy.ScopeKafka, "", true},
	} {
		if got := (policy.Consumer{Scope: tc.scope, Dedupe: tc.dedupe}).ReplayDeduped(); got != tc.want {
			t.Errorf("scope %s, dedupe %q: ReplayDeduped() = %v, want %v", tc.scope, tc.dedupe, got, tc.want)
		}
	}
}

func TestLoadNamesAFileItCannotRead(t *testing.T) {
	_, err := policy.Load(filepath.Join(t.TempDir(), "missing.yaml"))
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("got %v", err)
	}
}

func TestWrongShapes(t *testing.T) {
	wantProblem(t, problems(t, "version: 1\nconsumers: {a: 1}\n"), "svc.yaml:2:", "a mapping is not a list here; write a list of entries, each starting with - group:")
	wantProblem(t, problems(t, head+"  - group: a\n    scope: db\n    owner: x\n    replay: true\n"), "svc.yaml:5: consumer a: owner:", `"x" is not a mapping of fields; write its fields indented under it: team, contact`)
	wantProblem(t, problems(t, head+"  - 3\n"), "svc.yaml:3: consumer consumers[0]:", "group, scope, owner, replay")
	wantProblem(t, problems(t, "~\n"), "svc.yaml: is not a mapping")
}
