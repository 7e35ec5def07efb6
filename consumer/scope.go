package consumer

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/guard"
	"github.com/kscope-dev/kscope/retrytopic"
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

// The interfaces a scope implements to plug into the runner. Their
// contracts are documented on internal/engine's types of the same names
// (Scope, Batcher, Background, Delayer, Starter, ClientOptioner,
// StatsReporter), which
// kscope's scope packages implement.
type (
	workScope interface {
		Process(ctx context.Context, batch []*Record, done func(*Record))
	}
	batcher interface {
		BatchLimits() (maxBatch int, linger time.Duration)
	}
	background interface {
		RunBackground(ctx context.Context)
	}
	delayer interface {
		DelayedTopics() map[string]time.Duration
	}
	starter interface {
		Start(ctx context.Context) error
	}
	clientOptioner interface {
		ClientOptions() []kgo.Opt
	}
	statsReporter interface {
		ReportStats(st *Stats)
	}
)

// atLeastOnce is the AtLeastOnce scope: a record is done once its handler
// returns nil, is skipped as a business outcome, or is acknowledged by the
// dead-letter topic. A failing record is retried in place by the failure
// policy, blocking only its key-shard; its offset is never committed past.
type atLeastOnce struct {
	h         Handler
	f         *failures
	unordered bool
}

func (s *atLeastOnce) UseFailures(f any) { s.f = f.(*failures) }

// atLeastOnceBatch is how many queued records of one partition an
// AtLeastOnce worker takes from its key-shard's queue at a time. The handler
// still sees them one by one, in offset order, and each is done on its own;
// taking them together spares the queue's lock, the assignment's running
// count and a worker wake-up per record.
const atLeastOnceBatch = 64

// BatchLimits implements batcher: batches form from what is already queued,
// with no lingering.
func (s *atLeastOnce) BatchLimits() (int, time.Duration) { return atLeastOnceBatch, 0 }

// UsesRetryTopics: the AtLeastOnce scope has no store to park later records
// of a key in, so it keeps retries in place (order holds across restarts)
// unless the policy is Unordered.
func (s *atLeastOnce) UsesRetryTopics() bool { return s.unordered }

func (s *atLeastOnce) Process(ctx context.Context, batch []*Record, done func(*Record)) {
	obs := s.f.Observer()
	for _, r := range batch {
		if !s.deliver(ctx, obs, r, done) {
			obs.End(r, hook.OutcomeAborted, nil)
			return
		}
	}
}

// deliver runs one record through the handler and the failure policy. It
// reports false when the record was left undone (ctx done or revoked).
func (s *atLeastOnce) deliver(ctx context.Context, obs *observer, r *Record, done func(*Record)) bool {
	hctx := obs.Start(ctx, r)
	a := s.f.Attempts(ctx, r, s.unordered, done, func() error { return callHandler(hctx, s.h, r) })
	if !a.OK {
		return false
	}
	if a.Err == nil {
		obs.End(r, hook.OutcomeSuccess, nil)
		done(r)
		return true
	}
	if err := s.f.Route(ctx, r, a.Err, a.Step, a.N, a.First); err != nil {
		return false // ctx done while routing: not done, redelivered
	}
	obs.End(r, outcomeOf(a.Step.Action), a.Err)
	done(r)
	return true
}

// outcomeOf returns the outcome of a delivery whose failure ended in step
// action a: skipped, retried (a retry topic) or dead-lettered.
func outcomeOf(a retrytopic.Action) hook.Outcome {
	switch a {
	case retrytopic.ActionSkip:
		return hook.OutcomeSkipped
	case retrytopic.ActionRetryTopic:
		return hook.OutcomeRetried
	case retrytopic.ActionDeadLetter:
		return hook.OutcomeDeadLettered
	}
	return hook.OutcomeAborted
}

// callHandler runs h and turns a panic into an error, so that one bad record
// cannot take the process down with every other key-shard's work.
func callHandler(ctx context.Context, h Handler, r *Record) error {
	return guard.Call(func() error { return h.Handle(ctx, r) })
}
