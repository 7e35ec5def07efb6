package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/batchcall"
	"github.com/kscope-dev/kscope/scope"
)

// BatchHandler handles the ready records of one key-shard together, in
// the AtLeastOnce scope: up to 64 records of one partition that were
// queued when its worker took them, in offset order (records of several
// keys; per-key order holds). Its error says what became of each record:
//
//   - nil: every record succeeded;
//   - [FailedAt](i, err): the records before i succeeded, record i failed
//     with err and is routed by the failure policy on its own (its class
//     decides: a retry in place, which calls the handler again with record
//     i alone, a retry topic, the dead-letter topic, a skip), and the
//     records after i are handled again, in later calls, after record i's
//     outcome;
//   - any other error, or a panic: no record is known to have succeeded.
//     The batch is isolated: each of its records is handled again alone
//     (the handler is called with a one-record slice), so each gets an
//     outcome of its own.
//
// Records that the admission rules turn away (Config.Keep, MaxAge) are
// not passed to it: they have their outcome (filtered, expired) on their
// own, and the records around them are batched on each side. The call runs
// under Config.HandlerTimeout's deadline and the panic guard, as a
// [Handler]'s does.
type BatchHandler interface {
	HandleBatch(ctx context.Context, recs []*Record) error
}

// BatchHandlerFunc adapts a function to [BatchHandler].
type BatchHandlerFunc func(ctx context.Context, recs []*Record) error

// HandleBatch calls f(ctx, recs).
func (f BatchHandlerFunc) HandleBatch(ctx context.Context, recs []*Record) error { return f(ctx, recs) }

// BatchError is the error [FailedAt] returns: a batch handler's records
// before Index succeeded and record Index failed with Err. Every scope's
// batch handler returns it the same way; errors.As finds it through
// wrapping.
type BatchError struct {
	Index int
	Err   error
}

// FailedAt returns the error that tells a batch handler's scope that
// recs[:i] succeeded and recs[i] failed with err (nil err is taken as an
// error that says so). The failure policy classifies err as it would a
// [Handler]'s error: mark it with [Skip], [Terminal], [Retryable] or
// [DecodeError] to choose the class. An i outside the batch is read as a
// plain error: the batch is isolated.
func FailedAt(i int, err error) error {
	if err == nil {
		err = fmt.Errorf("kscope: the batch handler reported record %d failed, with a nil error", i)
	}
	return &BatchError{Index: i, Err: err}
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("kscope: record %d of the batch failed: %v", e.Index, e.Err)
}

// Unwrap returns the record's error.
func (e *BatchError) Unwrap() error { return e.Err }

// FailedIndex reads err, a batch handler's error, as [FailedAt] made it:
// the index of the failed record and its error. ok is false for any other
// error. Scopes of a service's own use it to carry out a batch handler's
// outcome as kscope's scopes do.
func FailedIndex(err error) (i int, rerr error, ok bool) {
	var be *BatchError
	if !errors.As(err, &be) {
		return 0, nil, false
	}
	return be.Index, be.Err, true
}

// NewBatch returns an AtLeastOnce runner whose handler takes the ready
// records of a key-shard together (see [BatchHandler]). Everything [New]
// says holds, record by record: a record's offset is committed only once
// it succeeded or its failure was routed, and a failing record is retried
// in place, blocking only its key-shard.
func NewBatch(cfg Config, h BatchHandler) (*Runner, error) {
	if h == nil {
		return nil, &ConfigError{Struct: "consumer.NewBatch's handler", Reason: "is nil; pass the function that handles each batch of records"}
	}
	return newRunner(cfg.WithDefaults(), &batchScope{atLeastOnce: atLeastOnce{unordered: cfg.Failures.Unordered, g: newGuard(cfg.WithDefaults())}, bh: h})
}

// batchScope is the AtLeastOnce scope with a batch handler.
// KeyHolds implements scope.KeyHolder: a batch call takes the records of
// many keys at once, so no key is held alone (Config.KeyBreaker is
// refused).
func (s *batchScope) KeyHolds() scope.KeyHold { return 0 }

type batchScope struct {
	atLeastOnce
	bh BatchHandler
}

var (
	_ scope.Batcher        = (*batchScope)(nil)
	_ ownScope             = (*batchScope)(nil)
	_ scope.RetryTopicUser = (*batchScope)(nil)
)

// BatchLimits implements scope.Batcher: batches form from what is already
// queued, with no lingering.
func (s *batchScope) BatchLimits() (int, time.Duration) { return atLeastOnceBatch, 0 }

// Process implements scope.Scope: the batch handler is called for the
// admitted records, then each record's outcome is carried out in order
// (see batchcall.Run).
func (s *batchScope) Process(ctx context.Context, batch []*Record, done func(*Record)) {
	obs := s.obs
	defer func() {
		for _, r := range batch {
			obs.End(r, hook.OutcomeAborted, nil) // a no-op for the records that ended
		}
	}()
	if s.g != nil {
		s.processBatchGuarded(ctx, batch, done)
		return
	}
	s.run(ctx, batch, done, nil)
}

// run calls the batch handler for recs and carries out each record's
// outcome (batchcall.Run). With won, a success is neither ended nor
// reported done but given to won. It reports false when a record was left
// undone.
func (s *batchScope) run(ctx context.Context, recs []*Record, done, won func(*Record)) bool {
	for _, r := range recs {
		s.obs.Start(ctx, r)
	}
	return batchcall.Run(recs, batchcall.Calls[*Record]{
		Admit: s.e.Admit,
		Batch: func(rs []*Record) error {
			return s.e.CallBatch(ctx, rs, func(ctx context.Context) error { return s.bh.HandleBatch(ctx, rs) })
		},
		FailedAt: FailedIndex,
		Each: func(r *Record, first batchcall.First) bool {
			return s.settle(ctx, r, first, done, won)
		},
	})
}

// settle carries out r's outcome: the batch call's (first), or that of
// calls of the handler with r alone, retried in place as the policy says.
// A success goes to won when it is not nil.
func (s *batchScope) settle(ctx context.Context, r *Record, first batchcall.First, done, won func(*Record)) bool {
	hctx := s.obs.Context(ctx, r)
	one := []*Record{r}
	ran := first.Ran
	a := s.f.Attempts(ctx, r, s.unordered, done, func() error {
		if ran {
			ran = false
			return first.Err
		}
		return s.e.Call(hctx, r, func(ctx context.Context) error { return s.bh.HandleBatch(ctx, one) })
	})
	if !a.OK {
		return false
	}
	if a.Err == nil {
		if won != nil {
			won(r)
			return true
		}
		s.obs.End(r, hook.OutcomeSuccess, nil)
		done(r)
		return true
	}
	if err := s.f.Route(ctx, r, a.Err, a.Step, a.N, a.First); err != nil {
		return false // ctx done while routing: not done, redelivered
	}
	s.obs.End(r, scope.OutcomeOf(a.Step.Action), a.Err)
	done(r)
	return true
}
