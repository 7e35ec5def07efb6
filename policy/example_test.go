package policy_test

import (
	"fmt"
	"log"
	"log/slog"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/policy"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
)

// A service reads its policy file at start and builds its runner's
// failure policy and gap options from its consumer group's entry.
func Example() {
	f, err := policy.Parse("kscope-policy.yaml", []byte(`
version: 1
consumers:
  - group: payments-ledger
    scope: db
    owner: {team: payments, contact: "#payments-oncall"}
    replay: true
    failures: {in_place_attempts: 2, ladder: [5s, 1m]}
    dead_letter: {retention: 720h}
    lag_objective: {p95_seconds: 120}
    gaps: {policy: dead_letter}
`))
	if err != nil {
		log.Fatal(err) // every problem: file, line, consumer, field and fix
	}
	entry, ok := f.Consumer("payments-ledger")
	if !ok {
		log.Fatal("no policy for payments-ledger")
	}
	cfg, conflicts, err := entry.Apply(consumer.Config{
		Brokers: []string{"localhost:9092"},
		Group:   "payments-ledger",
		Topics:  []string{"payments.captured"},
	})
	if err != nil {
		log.Fatal(err)
	}
	versions, _ := entry.ApplyGaps(&sequence.Config{}, slog.Default()) // dbscope.Options.Versions
	fmt.Println(cfg.Failures.InPlaceAttempts, cfg.Failures.Ladder, cfg.Failures.DeadLetterRetention, len(conflicts))
	fmt.Println(versions.Gaps == sequence.DeadLetter, entry.Replay, entry.LagP95())
	// Output:
	// 2 [5s 1m0s] 720h0m0s 0
	// true true 2m0s
}

// A problem names the file, the line, the consumer, the field and what to
// change.
func ExampleParse_problems() {
	_, err := policy.Parse("kscope-policy.yaml", []byte(`version: 1
consumers:
  - group: payments-ledger
    scope: db
    owner: {team: payments, contact: "#payments-oncall"}
    failures: {ladder: [1m, 5s]}
`))
	fmt.Println(err)
	// Output:
	// kscope-policy.yaml:3: consumer payments-ledger: replay: missing; add replay: true when kscope replay may move this group's offsets, or replay: false when its effects must never run again
}

// The code's value wins where both set a field, and the disagreement is
// returned (and logged).
func ExampleConsumer_Apply_conflict() {
	entry := policy.Consumer{
		Group: "orders", Scope: policy.ScopeAtLeastOnce, Replay: false,
		Owner:    policy.Owner{Team: "orders", Contact: "orders@example.com"},
		Failures: &policy.Failures{UnknownAttempts: 5},
	}
	cfg, conflicts, _ := entry.Apply(consumer.Config{
		Group:    "orders",
		Logger:   slog.New(slog.DiscardHandler),
		Failures: retrytopic.Policy{UnknownAttempts: 2},
	})
	fmt.Println(cfg.Failures.UnknownAttempts)
	fmt.Println(conflicts[0])
	// Output:
	// 2
	// consumer group orders: the code sets Failures.UnknownAttempts to 2 and the policy's failures.unknown_attempts says 5: the code's value is used; make them agree
}
