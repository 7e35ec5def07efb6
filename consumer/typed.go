package consumer

import (
	"context"

	"github.com/kscope-dev/kscope/codec"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Typed returns the Handler that decodes each record's value with c and
// calls fn with the record and the decoded value. A value c cannot decode
// (a *codec.DecodeFailure) never reaches fn: the record goes to the
// dead-letter topic at once, as a [DecodeError], its raw bytes unchanged,
// with the decode headers (retrytopic.HeaderDecodeError,
// HeaderDecodeFormat, HeaderSchemaID), and is counted in
// FailureStats.DecodeFailures. Any other error of c (a schema registry that
// does not answer) is retried like a handler's. fn's errors are
// classified as usual.
func Typed[T any](c codec.Codec[T], fn func(ctx context.Context, r *Record, v T) error) Handler {
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
// with the decode headers; any other error is returned as it is.
func DecodeValue[T any](ctx context.Context, c codec.Codec[T], r *Record) (T, error) {
	v, err := c.Decode(ctx, r.Topic, r.Value)
	if err != nil {
		if _, ok := retrytopic.AsDecodeFailure(err); ok {
			return v, DecodeError(err)
		}
		return v, err
	}
	return v, nil
}
