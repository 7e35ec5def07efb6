package scope

import (
	"context"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/guard"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Engine is what the runner gives an [EngineUser].
type Engine[R any] interface {
	// Failures is the runner's failure policy (consumer.Config.Failures)
	// and its one retry loop.
	Failures() Failures[R]
	// Observer dispatches the runner's hooks (consumer.Config.Hooks).
	Observer() Observer[R]
	// Shard returns the key-shard r was routed to.
	Shard(r R) int
	// Handling tells the runner's stall watch
	// (consumer.Config.StallWarning) that r's handler runs now, and
	// Handled that it returned. A scope that reports its records done only
	// once their batch's transaction commits calls them around each
	// handler call, so that a stall names the record whose handler has not
	// returned; a scope that reports each record done as it handles it
	// needs neither.
	Handling(r R)
	Handled(r R)
	// Admit applies the runner's admission rules to r before any handler
	// sees it (consumer.Config.Keep and MaxAge). It returns nil for a
	// record to handle; for a record turned away, the error that says why,
	// which the scope treats as the handler's own: a filtered record's is
	// of class skip (it is done, with the outcome hook.OutcomeFiltered),
	// an expired record's of class skip or terminal, as MaxAge's policy
	// says (hook.OutcomeExpired). Call applies it itself; a scope that
	// hands several records to one call (a batch handler) calls Admit for
	// each first.
	Admit(r R) error
	// Call runs one handler call for r the way the runner's configuration
	// says: Admit first (call is not run for a record turned away), then
	// call under consumer.Config.HandlerTimeout's deadline, through the
	// panic guard ([Call]) and the stall watch (Handling, Handled). A call
	// that fails after its deadline passed fails with an error of class
	// retryable unless it carries a class of its own; a call that runs on
	// past its deadline and a grace is reported. For a batch call, r is
	// the batch's first record and the scope has admitted each record.
	Call(ctx context.Context, r R, call func(ctx context.Context) error) error
	// CallBatch is Call for a call given the records rs (a batch
	// handler): no admission (the scope admitted each record), the
	// deadline, the panic guard, and the stall watch on rs[0].
	CallBatch(ctx context.Context, rs []R, call func(ctx context.Context) error) error
}

// Failures applies a runner's failure policy (consumer.Config.Failures):
// it classifies a handler error, decides between a retry in place, a retry
// topic, a skip and the dead-letter topic, and produces the records that
// carry a failure.
type Failures[R any] interface {
	// Class classifies err under the policy.
	Class(err error) retrytopic.Class
	// Decide returns what follows a failed attempt of rec, counting the
	// attempts of earlier hops (rec's headers) plus attempt, those made on
	// this hop. topics says whether the record may go to a retry topic;
	// it may only when the scope's UsesRetryTopics (RetryTopicUser) said
	// so too, since only then does the runner create and consume them.
	// It has no effect: Route carries the decision out. With
	// consumer.Config.KeyBreaker it counts a failure the key breaker's
	// Trips matches against rec's key (call it once per failed attempt)
	// and returns retrytopic.ActionHold once the key failed so
	// KeyBreakerConfig.Failures times within its Window; only a
	// [KeyHolder] scope is given that setting.
	Decide(ctx context.Context, rec R, err error, attempt int, topics bool) retrytopic.Step
	// Route carries out step for rec: for a skip it logs and counts; for
	// a retry topic or the dead-letter topic it produces the record with
	// its failure metadata and waits for the broker's acknowledgement,
	// retrying with backoff until it succeeds or ctx is done. Only then
	// may the scope call done(rec): a record routed is never lost.
	Route(ctx context.Context, rec R, err error, step retrytopic.Step, attempt int, firstFailure time.Time) error
	// Rounds is the runner's one retry loop: it calls round until a round
	// says there is no more (Round.More false) and reports whether it
	// ended with its work done (false: ctx ended, Round.Of's partition
	// was revoked, or a round said Stop). Between two rounds it calls
	// done(nil) (when done is not nil) and waits, holding the caller's
	// key-shard and nothing else: Round.Wait, or after a failed round
	// (Round.Err) a backoff that grows while rounds fail in a row, and
	// logs the failure.
	Rounds(ctx context.Context, done func(R), round func() Round[R]) bool
	// Attempts is a record's retry in place, on Rounds: it calls call
	// for rec until it succeeds or the policy decides something other
	// than a retry in place (a skip, a retry topic, the dead-letter
	// topic), which the caller carries out with Route. Before each retry
	// the policy logs and counts it.
	Attempts(ctx context.Context, rec R, topics bool, done func(R), call func() error) Attempt
	// DeadLetterRecord and RetryTopicRecord return the record that carries
	// rec to the dead-letter topic or to step's retry topic, for a scope
	// that produces it itself (the Kafka scope, in its transaction).
	DeadLetterRecord(rec R, err error, step retrytopic.Step, attempt int, firstFailure time.Time) *kgo.Record
	RetryTopicRecord(rec R, err error, step retrytopic.Step, attempt int, firstFailure time.Time) *kgo.Record
	// Metadata returns the failure metadata rec carries (on its first hop,
	// its own coordinates and identity).
	Metadata(rec R) retrytopic.Metadata
	// MetadataOf is Metadata for a record whose identity (id) the caller
	// has already computed.
	MetadataOf(rec R, id string) retrytopic.Metadata
	// Policy returns the failure policy, with its defaults.
	Policy() retrytopic.Policy
	// KeyProbe marks rec as its key's probe for a scope that holds keys
	// itself ([HoldInScope]), after failed probes that failed before it:
	// Decide then returns retrytopic.ActionHold, with the next cool-down
	// as Step.Delay, for a failure the key breaker's Trips matches, and
	// the policy's step for any other (the key's breaker closes).
	KeyProbe(rec R, failed int)
	// PanicStack returns the log attribute that carries the stack of the
	// handler panic err holds, the first time it is asked for rec (by
	// identity); nil after that, and when err holds no panic. Route adds
	// it to its lines; a scope that logs a record's failure itself (the
	// Kafka scope's retry and dead-letter lines) adds it to its own, so
	// that a panic's stack is logged once per record.
	PanicStack(rec R, err error) []slog.Attr
}

// Round is what one round of a scope's work did ([Failures].Rounds).
type Round[R any] struct {
	More bool // there is a next round
	// Of is the record the next round starts with: its partition's
	// revocation stops the loop (the zero R: only ctx does).
	Of   R
	Wait time.Duration // the wait before the next round: a retry in place's delay
	// Err says the round failed: it is logged, and the next one waits the
	// loop's growing backoff.
	Err error
	// Progress, with Err, says some of the round's records were done
	// first: the backoff starts over.
	Progress bool
	// Held, with Err, says the error is the deployment's, not the
	// record's (a missing table, a refused permission): the key-shard is
	// reported as holding, in consumer.Stats.Hold and to hook.HoldHook,
	// until a round of the loop succeeds or the loop ends.
	Held bool
	// Stop says the round left records undone (ctx ended while it carried
	// out a decision): the loop ends.
	Stop bool
}

// Attempt is how a record's attempts on one hop ended ([Failures].Attempts).
type Attempt struct {
	Err   error           // the handler's last error; nil when it succeeded
	Step  retrytopic.Step // for a failure: what the failure policy decided
	N     int             // the attempts made on this hop
	First time.Time       // when the first of them failed
	OK    bool            // false: the record was left undone (stopped, or its partition revoked)
	// Held says the record's key is held by its circuit breaker
	// (consumer.Config.KeyBreaker) and the runner keeps the record
	// ([HoldInMemory]): the scope ends its delivery with
	// hook.OutcomeHeld, does not report it done, and goes on with the
	// next record of its batch. The runner gives it to the scope's
	// Process again, on its key-shard, at the key's probe. OK is true.
	Held bool
}

// Observer dispatches a runner's hooks (consumer.Config.Hooks); every
// method is a no-op, and allocation-free, when no hook implements its
// interface.
type Observer[R any] interface {
	// Start begins a delivery of r (hook.RecordHook) and returns the
	// context the hooks returned; Context returns it again later.
	Start(ctx context.Context, r R) context.Context
	Context(ctx context.Context, r R) context.Context
	// End ends r's delivery with out, once; Ended reports whether it ended.
	End(r R, out hook.Outcome, err error)
	Ended(r R) bool
	// Event reports a step of r's delivery (hook.EventHook).
	Event(r R, ev hook.Event, detail string)
	// Inject adds the trace context of ctx to an output record's headers.
	Inject(ctx context.Context, out *kgo.Record)
	// Route reports a record a scope sent to a retry or dead-letter topic
	// itself (hook.RouteHook); Failures.Route reports its own.
	Route(r hook.Route)
}

// OutcomeOf returns the outcome of a delivery whose failure ended in step
// action a: skipped, retried (a retry topic) or dead-lettered.
func OutcomeOf(a retrytopic.Action) hook.Outcome {
	switch a {
	case retrytopic.ActionSkip:
		return hook.OutcomeSkipped
	case retrytopic.ActionRetryTopic:
		return hook.OutcomeRetried
	case retrytopic.ActionDeadLetter:
		return hook.OutcomeDeadLettered
	case retrytopic.ActionHold:
		return hook.OutcomeHeld
	}
	return hook.OutcomeAborted
}

// Call runs one call of a handler and turns a panic in it into the call's
// error, so that one bad record cannot take the process down with every
// other key-shard's work. The error carries the panic's stack, which
// [Failures].PanicStack logs once per record; an error whose Error method
// panics (a nil *T returned as an error, say) is replaced by one that says
// so. kscope's scopes run every handler call through it.
func Call(fn func() error) error { return guard.Call(fn) }
