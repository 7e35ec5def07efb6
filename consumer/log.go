package consumer

import (
	"log/slog"
	"time"
)

const maxLoggedKey = 64

// recordAttrs are the structured fields of a log line about one record:
// its coordinates, its key (truncated), its identity ("id": the kscope-id
// header, else the message-id header, else what Config.Identity derives),
// so that one message can be followed across services by its id, and the
// attempt. The value is never logged.
func (f *failures) recordAttrs(r *Record, attempt int, err error, retryIn time.Duration) []slog.Attr {
	key := r.Key
	if len(key) > maxLoggedKey {
		key = key[:maxLoggedKey]
	}
	attrs := []slog.Attr{
		slog.String("topic", r.Topic),
		slog.Int("partition", int(r.Partition)),
		slog.Int64("offset", r.Offset),
		slog.String("key", string(key)),
		slog.String("id", f.identity.Of(r)),
		slog.Int("attempt", attempt),
	}
	if err != nil {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	if retryIn > 0 {
		attrs = append(attrs, slog.Duration("retry_in", retryIn))
	}
	return attrs
}

// levelForAttempt keeps a flapping dependency from flooding the log: the
// first failures of a record are warnings, persistent ones errors.
func levelForAttempt(attempt int) slog.Level {
	if attempt >= 5 {
		return slog.LevelError
	}
	return slog.LevelWarn
}
