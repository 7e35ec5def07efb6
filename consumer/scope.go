package consumer

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/backoff"
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

// Scope turns the records of one key-shard into durable effects. kscope's
// scopes implement it: AtLeastOnce ([New]), the DB scope and the Kafka scope.
// It is exported so that those packages can build on the runner; most
// services use a scope's constructor instead of implementing one.
//
// Process receives records of one partition assignment, in offset order, and
// is never called concurrently for one shard. It calls done(r) once each
// record's effect is durable, from its own goroutine and before it returns;
// the runner commits a partition's offset only up to the lowest record not
// yet done. The runner may keep done reports to hand them to the
// watermark together (never past an offset commit); done(nil) hands over
// those kept so far at once, and a scope calls it before it waits (a
// backoff, a slow call). Process must not
// return while a record of a live assignment is not done, unless ctx is
// canceled (the assignment was lost, its drain timeout passed, or the
// runner stopped); records left undone are redelivered to the partition's
// next owner.
type Scope interface {
	Process(ctx context.Context, batch []*Record, done func(*Record))
}

// Batcher is implemented by a Scope that wants batches of more than one
// record: up to MaxBatch records of one partition, waiting at most Linger to
// fill a batch.
type Batcher interface {
	BatchLimits() (maxBatch int, linger time.Duration)
}

// Background is implemented by a Scope that has periodic work to do while
// the runner runs (an inbox cleanup, say). The runner calls RunBackground in
// a goroutine of its own when Run starts, cancels ctx when Run stops, and
// waits for it to return.
type Background interface {
	RunBackground(ctx context.Context)
}

// Delayer is implemented by a Scope that consumes delay topics (the retry
// topics): a record of one of them that carries a HeaderDue time in the
// future is held, with its partition paused, until that time; later records
// of the partition wait behind it. A handler never sleeps for it. The value
// is the longest delay records of that topic may carry: a due time further
// out (forged or corrupt) is treated as that far out, so it cannot block the
// partition. The runner consumes the delay topics besides Config.Topics.
type Delayer interface {
	DelayedTopics() map[string]time.Duration
}

// Starter is implemented by a Scope that checks what it needs before the
// runner consumes anything (its database tables, say). Run calls Start
// before it creates a Kafka client and returns its error, unless Run's
// context ended meanwhile (then Run returns nil, a clean stop).
type Starter interface {
	Start(ctx context.Context) error
}

// ClientOptioner is implemented by a Scope that needs options on the
// runner's Kafka client, such as an offset adjustment on assignment. They
// are applied after Config.ClientOptions and before kscope's own.
type ClientOptioner interface {
	ClientOptions() []kgo.Opt
}

// atLeastOnce is the AtLeastOnce scope: a record is done once its handler
// returns nil, is skipped as a business outcome, or is acknowledged by the
// dead-letter topic. A failing record is retried in place by the failure
// policy, blocking only its key-shard; its offset is never committed past.
type atLeastOnce struct {
	h         Handler
	f         *Failures
	unordered bool
}

func (s *atLeastOnce) UseFailures(f *Failures) { s.f = f }

// atLeastOnceBatch is how many queued records of one partition an
// AtLeastOnce worker takes from its key-shard's queue at a time. The handler
// still sees them one by one, in offset order, and each is done on its own;
// taking them together spares the queue's lock, the assignment's running
// count and a worker wake-up per record.
const atLeastOnceBatch = 64

// BatchLimits implements Batcher: batches form from what is already queued,
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
			obs.End(r, OutcomeAborted, nil)
			return
		}
	}
}

// deliver runs one record through the handler and the failure policy. It
// reports false when the record was left undone (ctx done or revoked).
func (s *atLeastOnce) deliver(ctx context.Context, obs *Observer, r *Record, done func(*Record)) bool {
	hctx := obs.Start(ctx, r)
	var first time.Time
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil || r.Revoked() {
			return false
		}
		err := callHandler(hctx, s.h, r)
		if err == nil {
			obs.End(r, OutcomeSuccess, nil)
			done(r)
			return true
		}
		if ctx.Err() != nil {
			return false // canceled mid-handler: the next owner handles it
		}
		if first.IsZero() {
			first = time.Now()
		}
		step, ferr := s.f.Handle(ctx, r, err, attempt, first, s.unordered)
		if ferr != nil {
			return false // ctx done while routing: not done, redelivered
		}
		if step.Action != retrytopic.ActionRetry {
			obs.End(r, OutcomeOf(step.Action), err)
			done(r)
			return true
		}
		done(nil) // the records before this one may commit while it waits
		if !backoff.SleepOr(ctx, step.Delay, r.RevokedCh()) {
			return false // stopped, or revoked: the next owner handles it
		}
	}
}

// OutcomeOf returns the outcome of a delivery whose failure ended in step
// action a: skipped, retried (a retry topic) or dead-lettered.
func OutcomeOf(a retrytopic.Action) Outcome {
	switch a {
	case retrytopic.ActionSkip:
		return OutcomeSkipped
	case retrytopic.ActionRetryTopic:
		return OutcomeRetried
	case retrytopic.ActionDeadLetter:
		return OutcomeDeadLettered
	}
	return OutcomeAborted
}

// callHandler runs h and turns a panic into an error, so that one bad record
// cannot take the process down with every other key-shard's work.
func callHandler(ctx context.Context, h Handler, r *Record) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("kscope: handler panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return h.Handle(ctx, r)
}
