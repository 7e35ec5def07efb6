package consumer

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Record is a consumed Kafka record as a handler sees it. The embedded
// kgo.Record exposes Topic, Partition, Offset, Key, Value, Headers and
// Timestamp. A handler must not keep the Record, or slices of it, after it
// returns.
type Record struct {
	*kgo.Record

	part   *partState
	size   int64
	offset int64 // Record.Offset, kept beside the runner's own fields
	shard  int32
	// breakerWaits counts the failures of this delivery that waited in
	// place for a circuit breaker (breaker.go): they use up no attempt.
	breakerWaits int32
	state        uint8
	// breakerWait says the last failure waits for a circuit breaker.
	breakerWait bool
	// keyRelease says the runner gives the record back to the scope from
	// its key's hold (keyhold.go); keyProbe is 1 + the failed probes
	// before it when the record is its key's probe (Config.KeyBreaker), 0
	// otherwise.
	keyRelease bool
	turned     uint8 // why the admission rules turned it away at its last handler call (handlercall.go), 0: admitted
	keyProbe   int16
	due        int64 // on a delay topic: when it may run, in Unix nanoseconds; 0 otherwise

	// The delivery's observation (Observer.Start), when hooks observe it.
	obs *recordObs

	// A task a transactional scope scheduled on the record's key-shard
	// (scope.TxnEngine.Schedule): it runs instead of the scope's Process.
	task func(ctx context.Context, r *Record)
}

// recordObs is a delivery's observation: kept apart from Record so that a
// runner without hooks does not carry (and clear) it for every record.
type recordObs struct {
	ctx   context.Context
	start time.Time
	ended bool
}

const (
	recPending  uint8 = iota
	recFinished       // done by the scope; its in-flight room not yet given back
	recDone           // given back: nothing more to do for it
	recKeyHeld        // held by its key's circuit breaker: not done, its in-flight room kept (keyhold.go)
)

// Header returns the value of the last header named key, and whether there
// was one.
func (r *Record) Header(key string) ([]byte, bool) {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == key {
			return r.Headers[i].Value, true
		}
	}
	return nil, false
}

// Revoked reports whether the partition this record was consumed from has
// been revoked from (or lost by) this member since the record was polled.
// A scope checks it to skip records that the next owner will receive.
func (r *Record) Revoked() bool {
	return r.part != nil && r.part.Revoked()
}

// revokedCh returns a channel that is closed when the record's partition is
// revoked from (or lost by) this member (nil for a record not consumed by
// a runner).
func revokedCh(r *Record) <-chan struct{} {
	if r == nil || r.part == nil {
		return nil
	}
	return r.part.RevokedCh()
}

func recordSize(r *kgo.Record) int64 {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}
