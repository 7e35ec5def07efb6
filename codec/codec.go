package codec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// Codec encodes values of type T into record payloads and decodes them
// back. topic is the record's topic: the registry codecs derive the
// schema's subject from it (see [SubjectNameStrategy]); the plain codecs
// ignore it and ctx. A Codec is safe for concurrent use.
//
// Decode returns a *[DecodeFailure] for a payload that cannot be decoded
// (the record is poison) and any other error for a failure that is not
// the payload's (a registry that does not answer), which is retried.
type Codec[T any] interface {
	Encode(ctx context.Context, topic string, v T) ([]byte, error)
	Decode(ctx context.Context, topic string, data []byte) (T, error)
}

// DecodeFailure is the error Decode returns for a payload it cannot decode;
// see retrytopic.DecodeFailure.
type DecodeFailure = retrytopic.DecodeFailure

// The formats a codec names in its decode failures (the
// retrytopic.HeaderDecodeFormat header).
const (
	FormatJSON     = "json"
	FormatAvro     = "avro"
	FormatProtobuf = "protobuf"
)

// fail returns the decode failure of a payload in format.
func fail(format string, err error) *DecodeFailure {
	return &DecodeFailure{Err: err, Format: format}
}

// failID returns the decode failure of a payload in format that named
// schema id.
func failID(format string, id int, err error) *DecodeFailure {
	return &DecodeFailure{Err: err, Format: format, SchemaID: id, HasSchemaID: true}
}

// incompatible marks f as the failure of a schema the reader cannot use.
func incompatible(f *DecodeFailure) *DecodeFailure {
	f.Incompatible = true
	return f
}

// jsonCodec is JSON's Codec.
type jsonCodec[T any] struct{ strict bool }

// JSON returns the codec of T as JSON, with encoding/json. A payload that
// is not valid JSON, or does not fit T (a string where T has a number), is
// a decode failure; fields T does not have are ignored.
func JSON[T any]() Codec[T] { return jsonCodec[T]{} }

// StrictJSON is [JSON] that also refuses a payload with a field T does not
// have (json.Decoder.DisallowUnknownFields) or with more than one value.
func StrictJSON[T any]() Codec[T] { return jsonCodec[T]{strict: true} }

// Encode returns v as JSON.
func (jsonCodec[T]) Encode(_ context.Context, _ string, v T) ([]byte, error) {
	return json.Marshal(v)
}

// Decode reads data as a JSON T.
func (c jsonCodec[T]) Decode(_ context.Context, _ string, data []byte) (T, error) {
	var v T
	if !c.strict {
		if err := json.Unmarshal(data, &v); err != nil {
			return v, fail(FormatJSON, err)
		}
		return v, nil
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(&v); err != nil {
		return v, fail(FormatJSON, err)
	}
	if d.More() {
		return v, fail(FormatJSON, errors.New("more than one JSON value"))
	}
	return v, nil
}

// NewRecord returns the record of v, encoded with c, to topic with key:
// for txn's Emitter, outbox.Add or a kgo client (txn.EmitValue and
// outbox.AddValue do it in one call).
func NewRecord[T any](ctx context.Context, c Codec[T], topic string, key []byte, v T) (*kgo.Record, error) {
	b, err := c.Encode(ctx, topic, v)
	if err != nil {
		return nil, fmt.Errorf("codec: encoding a value for topic %s: %w", topic, err)
	}
	return &kgo.Record{Topic: topic, Key: key, Value: b}, nil
}
