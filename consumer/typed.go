package consumer

import (
	"context"

	"github.com/kscope-dev/kscope/internal/route"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Decoder decodes record values into T: every codec.Codec[T] is one
// (package codec holds JSON, Protobuf and Avro, plain or through a schema
// registry). The scopes' typed handlers take a Decoder so that a service
// that uses none of package codec's formats does not build them.
type Decoder[T any] interface {
	// Decode returns data, the value of a record of topic, as a T. A
	// payload that cannot be decoded is a *retrytopic.DecodeFailure (a
	// codec.DecodeFailure); any other error is a failure to try again.
	Decode(ctx context.Context, topic string, data []byte) (T, error)
}

// Encoder encodes T values for the records of a topic: every
// codec.Codec[T] is one. txn.EmitValue and outbox.AddValue take one.
type Encoder[T any] interface {
	Encode(ctx context.Context, topic string, v T) ([]byte, error)
}

// Typed returns the Handler that decodes each record's value with c and
// calls fn with the record and the decoded value. A value c cannot decode
// (a *codec.DecodeFailure) never reaches fn: the record goes to the
// dead-letter topic at once, as a [DecodeError], its raw bytes unchanged,
// with the decode headers (retrytopic.HeaderDecodeError,
// HeaderDecodeFormat, HeaderSchemaID), and is counted in
// FailureStats.DecodeFailures. Any other error of c (a schema registry that
// does not answer) is retried like a handler's. fn's errors are
// classified as usual.
func Typed[T any](c Decoder[T], fn func(ctx context.Context, r *Record, v T) error) Handler {
	return HandlerFunc(func(ctx context.Context, r *Record) error {
		v, err := DecodeValue(ctx, c, r)
		if err != nil {
			return err
		}
		return fn(ctx, r, v)
	})
}

// DecodeValue decodes r's value with c, for a handler that decodes by
// itself (Typed does it for one): a value c cannot decode is returned as a
// [DecodeError], which sends the record to the dead-letter topic at once
// with the decode headers; any other error is returned as it is. A record
// of a retry topic is decoded as one of the topic it was first consumed
// from (its HeaderOriginalTopic), whose subject its schema is under.
func DecodeValue[T any](ctx context.Context, c Decoder[T], r *Record) (T, error) {
	v, err := c.Decode(ctx, route.RoutedTopic(r.Topic, r.Header), r.Value)
	if err != nil {
		if _, ok := retrytopic.AsDecodeFailure(err); ok {
			return v, DecodeError(err)
		}
		return v, err
	}
	return v, nil
}
