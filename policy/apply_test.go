package policy_test

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/policy"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
)

func ledger(t *testing.T) policy.Consumer {
	t.Helper()
	f, err := policy.Load("testdata/service.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, _ := f.Consumer("payments-ledger")
	return c
}

// A Config that sets no failure option gets the policy's; the runner
// built from it accepts it.
func TestApplyFillsTheFailurePolicy(t *testing.T) {
	cfg, conflicts, err := ledger(t).Apply(consumer.Config{Brokers: []string{"127.0.0.1:1"}, Topics: []string{"captures"}})
	if err != nil || len(conflicts) != 0 {
		t.Fatalf("err %v, conflicts %v", err, conflicts)
	}
	want := retrytopic.Policy{
		Backoff: 200 * time.Millisecond, MaxBackoff: 10 * time.Second, InPlaceAttempts: 2, RetryableAttempts: 9, UnknownAttempts: 4,
		Ladder: []time.Duration{5 * time.Second, time.Minute}, DeadLetterTopic: "payments-ledger.dlt", DeadLetterRetention: 720 * time.Hour,
	}
	f := cfg.Failures
	if cfg.Group != "payments-ledger" || f.Backoff != want.Backoff || f.MaxBackoff != want.MaxBackoff || f.InPlaceAttempts != want.InPlaceAttempts ||
		f.RetryableAttempts != want.RetryableAttempts || f.UnknownAttempts != want.UnknownAttempts || !slices.Equal(f.Ladder, want.Ladder) ||
		f.DeadLetterTopic != want.DeadLetterTopic || f.DeadLetterRetention != want.DeadLetterRetention {
		t.Fatalf("group %q, failures %+v", cfg.Group, f)
	}
	if cfg.Owner != "payments <#payments-oncall>" {
		t.Fatalf("owner %q, want the policy's as \"team <contact>\"", cfg.Owner)
	}
	_, err = consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatalf("the runner refused the applied Config: %v", err)
	}
	if got := f.WithDefaults(cfg.Group).RetryTopics(); !slices.Equal(got, []string{"payments-ledger.kscope-retry-5s", "payments-ledger.kscope-retry-1m"}) {
		t.Fatalf("retry topics %v", got)
	}
}

// Where both set a field, the code's value wins, with a WARN and a
// Conflict; the fields the code leaves out still come from the policy.
func TestApplyKeepsTheCodesValueOnAConflict(t *testing.T) {
	var logs bytes.Buffer
	cfg := consumer.Config{
		Group:  "payments-ledger",
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Failures: retrytopic.Policy{
			Ladder:          []time.Duration{time.Second},
			InPlaceAttempts: 2, // agrees: no conflict
			DeadLetterTopic: "ledger-dead",
		},
	}
	got, conflicts, err := ledger(t).Apply(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Failures.Ladder, []time.Duration{time.Second}) || got.Failures.DeadLetterTopic != "ledger-dead" || got.Failures.Backoff != 200*time.Millisecond {
		t.Fatalf("failures %+v", got.Failures)
	}
	if len(conflicts) != 2 {
		t.Fatalf("conflicts %v", conflicts)
	}
	c := conflicts[1]
	if c.Group != "payments-ledger" || c.Field != "Failures.Ladder" || c.Key != "failures.ladder" || c.Code != "[1s]" || c.Policy != "[5s, 1m0s]" {
		t.Fatalf("conflict %+v", c)
	}
	if !strings.Contains(c.String(), "the code's value is used") {
		t.Fatalf("String: %s", c)
	}
	for _, s := range []string{"level=WARN", "the code and the policy disagree", "field=Failures.Ladder", "field=Failures.DeadLetterTopic", "policy_file=testdata/service.yaml"} {
		if !strings.Contains(logs.String(), s) {
			t.Fatalf("log lacks %q:\n%s", s, logs.String())
		}
	}
}

// An owner the code sets wins over the policy's, with a Conflict.
func TestApplyKeepsTheCodesOwner(t *testing.T) {
	cfg, conflicts, err := ledger(t).Apply(consumer.Config{Owner: "ledger <ledger@example.com>", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Owner != "ledger <ledger@example.com>" || len(conflicts) != 1 || conflicts[0].Field != "Owner" || conflicts[0].Key != "owner" ||
		conflicts[0].Policy != `"payments <#payments-oncall>"` {
		t.Fatalf("owner %q, conflicts %v", cfg.Owner, conflicts)
	}
}

func TestApplyRefusesAnotherGroupsConfig(t *testing.T) {
	_, _, err := ledger(t).Apply(consumer.Config{Group: "orders"})
	if err == nil || !strings.Contains(err.Error(), `applied to a consumer.Config of group "orders"`) {
		t.Fatalf("got %v", err)
	}
	bad := policy.Consumer{Group: "x", Scope: "db", Owner: policy.Owner{Team: "t", Contact: "c"}, Failures: &policy.Failures{InPlaceAttempts: -1}}
	if _, _, err := bad.Apply(consumer.Config{}); err == nil || !strings.Contains(err.Error(), "failures.in_place_attempts: is -1") {
		t.Fatalf("an invalid entry: %v", err)
	}
}

func TestApplyGaps(t *testing.T) {
	c := ledger(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	v, conflicts := c.ApplyGaps(&sequence.Config{}, log)
	if len(conflicts) != 0 || v.Gaps != sequence.DeadLetter || v.First != sequence.FirstMustBeOne || v.Header != "account-version" {
		t.Fatalf("versions %+v, conflicts %v", v, conflicts)
	}

	// The code's choice stands.
	v, conflicts = c.ApplyGaps(&sequence.Config{Gaps: sequence.Accept, Header: "account-version"}, log)
	if v.Gaps != sequence.Accept || len(conflicts) != 1 || conflicts[0].Field != "Versions.Gaps" || conflicts[0].Code != "accept" || conflicts[0].Policy != "dead_letter" {
		t.Fatalf("versions %+v, conflicts %v", v, conflicts)
	}

	// The policy never turns version checks on.
	v, conflicts = c.ApplyGaps(nil, log)
	if v != nil || len(conflicts) != 1 || conflicts[0].Field != "Versions" {
		t.Fatalf("versions %+v, conflicts %v", v, conflicts)
	}
	if !strings.Contains(logs.String(), "field=Versions ") {
		t.Fatalf("log:\n%s", logs.String())
	}

	// Wait, then accept.
	wait := policy.Consumer{Group: "g", Gaps: &policy.Gaps{Policy: policy.GapWait, Timeout: policy.Duration(time.Minute), OnTimeout: policy.TimeoutAccept}}
	v, conflicts = wait.ApplyGaps(&sequence.Config{}, log)
	if len(conflicts) != 0 || v.Gaps != sequence.Wait || v.GapTimeout != time.Minute || v.OnTimeout != sequence.TimeoutAccept || v.Validate() != nil {
		t.Fatalf("versions %+v, conflicts %v", v, conflicts)
	}

	// No gap policy: versions as they are.
	in := &sequence.Config{Gaps: sequence.Accept}
	if v, conflicts := (policy.Consumer{}).ApplyGaps(in, log); v != in || conflicts != nil {
		t.Fatalf("got %+v, %v", v, conflicts)
	}
}
