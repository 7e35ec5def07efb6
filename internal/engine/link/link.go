// Package link carries the consumer package's runner internals to
// internal/engine. The consumer package sets these variables in its init;
// internal/engine gives them their types. Nothing else uses them.
package link

// Each variable holds a function of the consumer package, typed in its
// terms; internal/engine asserts the type.
var (
	NewRunner           any // func(consumer.Config, any) (*consumer.Runner, error)
	CheckConfig         any // func(consumer.Config) (consumer.Config, error)
	NewFailures         any // func(consumer.Config, *kgo.Client, *slog.Logger) any
	NewObserver         any // func(string, []consumer.Hook) any
	ObserverOf          any // func(any) any
	EnsureFailureTopics any // func(context.Context, consumer.Config, bool) error
	LeftoverRetryTopics any // func(context.Context, consumer.Config, bool) (map[string]time.Duration, error)
	DueOf               any // func(*consumer.Record, time.Time, time.Duration) (time.Time, bool)
	OutcomeOf           any // func(retrytopic.Action) consumer.Outcome
	ShardOf             any // func(*consumer.Record) int
	RevokedCh           any // func(*consumer.Record) <-chan struct{}
)
