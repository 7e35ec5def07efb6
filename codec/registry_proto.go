package codec

import (
	"context"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// registryProto is Protobuf's Codec in the Confluent wire format.
type registryProto[T proto.Message] struct {
	*registry
	index []int // T's message index in its .proto file
}

// RegistryProto returns the codec of the generated Protobuf message type T
// in the Confluent wire format (magic byte, schema id, message index, then
// the message), through the schema registry of r. schema is the text of
// T's .proto file as registered; it may be empty, and Encode then uses the
// latest version of the topic's subject (r.AutoRegister needs the text).
//
// Encode frames v with the schema id of the topic's subject (cached per
// subject) and T's message index in its file. Decode reads the schema id,
// checks with the registry the first time an id is seen (cached in an
// sr.Serde) that it is a Protobuf schema, checks that the message index is
// T's, and parses the message as a T. A wrong magic byte, an id the
// registry does not have, an id of another schema type, another message's
// index, or a body that does not parse is a decode failure.
func RegistryProto[T proto.Message](r Registry, schema string) (Codec[T], error) {
	desc := (*new(T)).ProtoReflect().Descriptor()
	reg, err := newRegistry(r, FormatProtobuf, sr.TypeProtobuf, schema, string(desc.FullName()))
	if err != nil {
		return nil, err
	}
	return &registryProto[T]{registry: reg, index: messageIndex(desc)}, nil
}

// messageIndex returns the path of message d in its file: its index among
// the file's top-level messages, then among its parent's nested ones.
func messageIndex(d protoreflect.MessageDescriptor) []int {
	var path []int
	for {
		path = append(path, d.Index())
		parent, ok := d.Parent().(protoreflect.MessageDescriptor)
		if !ok {
			break
		}
		d = parent
	}
	slices.Reverse(path)
	return path
}

// Encode returns v in the wire format.
func (c *registryProto[T]) Encode(ctx context.Context, topic string, v T) ([]byte, error) {
	s, err := c.encoder(ctx, topic, func(s *sr.Serde, id int) {
		s.Register(id, *new(T), sr.Index(c.index...),
			sr.EncodeFn(func(v any) ([]byte, error) { return proto.Marshal(v.(T)) }))
	})
	if err != nil {
		return nil, err
	}
	return s.Encode(v)
}

// Decode reads data, in the wire format, as a T.
func (c *registryProto[T]) Decode(ctx context.Context, _ string, data []byte) (T, error) {
	v := newMessage[T]()
	err := c.decode(ctx, data, &v, *new(T), c.build)
	return v, err
}

// build returns the decoder of payloads in the Protobuf schema sch: the
// message index, which must be T's, then T's bytes.
func (c *registryProto[T]) build(sr.Schema) (decodeFn, error) {
	var header sr.ConfluentHeader
	return func(body []byte, into any) error {
		index, rest, err := header.DecodeIndex(body, len(c.index))
		if err != nil {
			return fmt.Errorf("the message index does not parse: %w", err)
		}
		if !slices.Equal(index, c.index) {
			return fmt.Errorf("the payload is the message at index %v of its schema, not %T (index %v)", index, *new(T), c.index)
		}
		m := newMessage[T]()
		if err := proto.Unmarshal(rest, m); err != nil {
			return err
		}
		*into.(*T) = m
		return nil
	}, nil
}
