package txn

import (
	"context"
	"fmt"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Typed returns the Handler that decodes each input record's value with c
// and calls fn with the record, the decoded value and the Emitter of its
// outputs. A value c cannot decode never reaches fn: the record's
// dead-letter record, its raw bytes unchanged, with the decode headers
// (see consumer.Typed), is produced in the input's transaction instead of
// any output.
func Typed[T any](c consumer.Decoder[T], fn func(ctx context.Context, r *consumer.Record, v T, out Emitter) error) Handler {
	return HandlerFunc(func(ctx context.Context, r *consumer.Record, out Emitter) error {
		v, err := consumer.DecodeValue(ctx, c, r)
		if err != nil {
			return err
		}
		return fn(ctx, r, v, out)
	})
}

// EmitValue emits the record of v, encoded with c, to topic with key: an
// output of the input's transaction, like out.Emit. An encode error (a
// value c cannot encode, a schema registry that refuses the schema) is
// returned and nothing is emitted; return it from the handler.
func EmitValue[T any](ctx context.Context, out Emitter, c consumer.Encoder[T], topic string, key []byte, v T) error {
	b, err := c.Encode(ctx, topic, v)
	if err != nil {
		return fmt.Errorf("txn: encoding a value for topic %s: %w", topic, err)
	}
	out.Emit(&kgo.Record{Topic: topic, Key: key, Value: b})
	return nil
}
