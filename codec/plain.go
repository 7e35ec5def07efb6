package codec

import (
	"context"
	"fmt"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/proto"
)

// protoCodec is Protobuf's plain Codec.
type protoCodec[T proto.Message] struct{}

// Proto returns the codec of the generated Protobuf message type T (a
// pointer such as *orderpb.Order) as bare Protobuf bytes, with
// google.golang.org/protobuf. A payload that does not parse as T is a
// decode failure. For the Confluent wire format, use [RegistryProto].
func Proto[T proto.Message]() Codec[T] { return protoCodec[T]{} }

// Encode returns v's Protobuf bytes.
func (protoCodec[T]) Encode(_ context.Context, _ string, v T) ([]byte, error) {
	return proto.Marshal(v)
}

// Decode parses data as a T.
func (protoCodec[T]) Decode(_ context.Context, _ string, data []byte) (T, error) {
	v := newMessage[T]()
	if err := proto.Unmarshal(data, v); err != nil {
		return v, fail(FormatProtobuf, err)
	}
	return v, nil
}

// newMessage returns a new, empty T.
func newMessage[T proto.Message]() T {
	var zero T
	return zero.ProtoReflect().Type().New().Interface().(T)
}

// avroCodec is Avro's plain Codec.
type avroCodec[T any] struct{ schema avro.Schema }

// Avro returns the codec of T as bare Avro binary in schema (its JSON
// text), with github.com/hamba/avro/v2: T's fields map to the schema's by
// their `avro:"name"` tags. A schema that does not parse is an error here.
// A payload that does not decode in schema (a truncated body, a bad union
// index) is a decode failure. For the Confluent wire format, where each
// payload names its writer's schema, use [RegistryAvro].
func Avro[T any](schema string) (Codec[T], error) {
	s, err := avro.Parse(schema)
	if err != nil {
		return nil, fmt.Errorf("codec: the Avro schema does not parse; give its JSON text: %w", err)
	}
	return avroCodec[T]{schema: s}, nil
}

// Encode returns v's Avro binary.
func (c avroCodec[T]) Encode(_ context.Context, _ string, v T) ([]byte, error) {
	return avro.Marshal(c.schema, v)
}

// Decode reads data as a T in the codec's schema.
func (c avroCodec[T]) Decode(_ context.Context, _ string, data []byte) (T, error) {
	var v T
	if err := avro.Unmarshal(c.schema, data, &v); err != nil {
		return v, fail(FormatAvro, err)
	}
	return v, nil
}
