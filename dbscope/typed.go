package dbscope

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
)

// Typed returns the Handler that decodes each record's value with c and
// calls fn with the record's transaction, the record and the decoded value.
// A value c cannot decode never reaches fn: no transaction commits for it
// and the record goes to the dead-letter topic at once, its raw bytes
// unchanged, with the decode headers (see consumer.Typed). fn runs as a
// Handler does: its writes commit with the record's inbox row, exactly
// once.
func Typed[T any](c consumer.Decoder[T], fn func(ctx context.Context, tx pgx.Tx, r *consumer.Record, v T) error) Handler {
	return HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		v, err := consumer.DecodeValue(ctx, c, r)
		if err != nil {
			return err
		}
		return fn(ctx, tx, r, v)
	})
}

// TypedQueue is [Typed] for a [QueueHandler]: fn queues the statements of
// the record and its decoded value on q.
func TypedQueue[T any](c consumer.Decoder[T], fn func(ctx context.Context, q *Queue, r *consumer.Record, v T) error) QueueHandler {
	return QueueFunc(func(ctx context.Context, q *Queue, r *consumer.Record) error {
		v, err := consumer.DecodeValue(ctx, c, r)
		if err != nil {
			return err
		}
		return fn(ctx, q, r, v)
	})
}
