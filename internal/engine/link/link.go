// Package link carries the consumer package's runner internals to
// internal/engine. The consumer package sets these variables in its init;
// internal/engine gives them their types. Nothing else uses them.
package link

import (
	"time"

	"github.com/kscope-dev/kscope/retrytopic"
)

// Attempt is how a record's attempts on one hop ended (engine.Attempt).
type Attempt struct {
	Err   error           // the handler's last error; nil when it succeeded
	Step  retrytopic.Step // for a failure: what the failure policy decided
	N     int             // the attempts made on this hop
	First time.Time       // when the first of them failed
	OK    bool            // false: the record was left undone (stopped, or its partition revoked)
}

// Each variable holds a function of the consumer package, typed in its
// terms; internal/engine asserts the type.
var (
	NewRunner   any // func(consumer.Config, any) (*consumer.Runner, error)
	CheckConfig any // func(consumer.Config) (consumer.Config, error)
	NewObserver any // func(string, []hook.Hook) any
	ObserverOf  any // func(any) any
	DueOf       any // func(*consumer.Record, time.Time, time.Duration) (time.Time, bool)
	OutcomeOf   any // func(retrytopic.Action) hook.Outcome
	ShardOf     any // func(*consumer.Record) int
	RevokedCh   any // func(*consumer.Record) <-chan struct{}
	Handling    any // func(*consumer.Record)
	Handled     any // func(*consumer.Record)
)

// Round is what one round of a scope's work did (engine.Round); R is
// *consumer.Record.
type Round[R any] struct {
	More     bool          // there is a next round
	Of       R             // the record the next round starts with: its partition's revocation stops the loop (nil: only ctx does)
	Wait     time.Duration // the wait before the next round: a retry in place's delay
	Err      error         // the round failed: the next one waits the loop's growing backoff
	Progress bool          // with Err: some of the round's records were done first (the backoff starts over)
	Held     bool          // with Err: the error says the deployment is wrong, not the record: the key-shard holds (reported as a hold) until a round succeeds
	Stop     bool          // the round left records undone (ctx ended while it carried out a decision): the loop ends
}
