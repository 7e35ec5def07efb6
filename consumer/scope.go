package consumer

import (
	"context"
	"time"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/scope"
)

// Handler handles one record in the AtLeastOnce scope. A nil error means the
// record's work is done and its offset may be committed.
type Handler interface {
	Handle(ctx context.Context, r *Record) error
}

// HandlerFunc adapts a function to [Handler].
type HandlerFunc func(ctx context.Context, r *Record) error

// Handle calls f(ctx, r).
func (f HandlerFunc) Handle(ctx context.Context, r *Record) error { return f(ctx, r) }

// workScope is the scope a runner runs (package scope documents the
// contract); the runner finds a scope's optional interfaces (scope.Batcher,
// scope.Transactor, ...) by type assertion when it is built.
type workScope = scope.Scope[*Record]

// The scopes of this package, the DB scope and the Kafka scope implement
// the contract's interfaces; these assertions make a changed signature a
// compile error here, where the runner looks for them.
var (
	_ scope.Batcher           = (*atLeastOnce)(nil)
	_ ownScope                = (*atLeastOnce)(nil)
	_ scope.RetryTopicUser    = (*atLeastOnce)(nil)
	_ scope.KeyHolder         = (*atLeastOnce)(nil)
	_ scope.Engine[*Record]   = engineOf{}
	_ scope.Failures[*Record] = (*failures)(nil)
	_ scope.Observer[*Record] = (*observer)(nil)
)

// atLeastOnce is the AtLeastOnce scope: a record is done once its handler
// returns nil, is skipped as a business outcome, or is acknowledged by the
// dead-letter topic. A failing record is retried in place by the failure
// policy, blocking only its key-shard; its offset is never committed past.
type atLeastOnce struct {
	h Handler
	// e, f and obs are the runner's engine, failure policy and hooks, by
	// their concrete types: through an interface, the closures of a
	// record's call would escape to the heap, two allocations a record.
	e         engineOf
	f         *failures
	obs       *observer
	unordered bool
	g         *dedupeGuard // Config.Dedupe; nil without a store
	// direct says no feature of a handler call is configured (directCalls):
	// Process calls the handler itself (deliverBatch).
	direct bool
}

// ownScope is what the runner gives the scopes of this package where
// other scopes get scope.EngineUser's engine: its failure policy, by its
// concrete type.
type ownScope interface {
	bind(f *failures)
}

// bind implements ownScope.
func (s *atLeastOnce) bind(f *failures) {
	s.e, s.f, s.obs = engineOf{f}, f, f.obs
	s.direct = directCalls(f)
	if s.g != nil {
		s.g.f, s.g.obs = f, f.obs
	}
}

// atLeastOnceBatch is how many queued records of one partition an
// AtLeastOnce worker takes from its key-shard's queue at a time. The handler
// still sees them one by one, in offset order, and each is done on its own;
// taking them together spares the queue's lock, the assignment's running
// count and a worker wake-up per record.
const atLeastOnceBatch = 64

// BatchLimits implements scope.Batcher: batches form from what is already queued,
// with no lingering.
func (s *atLeastOnce) BatchLimits() (int, time.Duration) { return atLeastOnceBatch, 0 }

// UsesRetryTopics: the AtLeastOnce scope has no store to park later records
// of a key in, so it keeps retries in place (order holds across restarts)
// unless the policy is Unordered.
func (s *atLeastOnce) UsesRetryTopics() bool { return s.unordered }

// KeyHolds implements scope.KeyHolder: the runner keeps the records of a
// key its circuit breaker holds (Config.KeyBreaker) in memory.
func (s *atLeastOnce) KeyHolds() scope.KeyHold { return scope.HoldInMemory }

func (s *atLeastOnce) Process(ctx context.Context, batch []*Record, done func(*Record)) {
	if s.g != nil {
		s.processGuarded(ctx, batch, done)
		return
	}
	if s.direct {
		s.deliverBatch(ctx, batch, done)
		return
	}
	obs := s.obs
	for _, r := range batch {
		if ok, _ := s.deliver(ctx, obs, r, done, false); !ok {
			obs.End(r, hook.OutcomeAborted, nil)
			return
		}
	}
}

// deliver runs one record through the handler and the failure policy. It
// reports false when the record was left undone (ctx done or revoked).
// With later, a success is neither ended nor reported done but returned
// (succeeded): the caller does both once the guard remembered it.
func (s *atLeastOnce) deliver(ctx context.Context, obs scope.Observer[*Record], r *Record, done func(*Record), later bool) (ok, succeeded bool) {
	hctx := obs.Start(ctx, r)
	return s.settle(ctx, obs, r, done, later, s.f.Attempts(ctx, r, s.unordered, done, s.calling(hctx, r)))
}

// calling returns r's handler call through the engine.
func (s *atLeastOnce) calling(ctx context.Context, r *Record) func() error {
	return func() error { return s.e.Call(ctx, r, func(ctx context.Context) error { return s.h.Handle(ctx, r) }) }
}

// settle carries out what r's attempts came to (deliver's results).
func (s *atLeastOnce) settle(ctx context.Context, obs scope.Observer[*Record], r *Record, done func(*Record), later bool, a scope.Attempt) (ok, succeeded bool) {
	if !a.OK {
		return false, false
	}
	if a.Held {
		obs.End(r, hook.OutcomeHeld, a.Err)
		return true, false // the runner keeps it, and gives it back at its key's probe
	}
	if a.Err == nil {
		if later {
			return true, true
		}
		obs.End(r, hook.OutcomeSuccess, nil)
		done(r)
		return true, true
	}
	if err := s.f.Route(ctx, r, a.Err, a.Step, a.N, a.First); err != nil {
		return false, false // ctx done while routing: not done, redelivered
	}
	obs.End(r, scope.OutcomeOf(a.Step.Action), a.Err)
	done(r)
	return true, false
}
