package codec

import (
	"context"
	"fmt"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
)

// registryAvro is Avro's Codec in the Confluent wire format.
type registryAvro[T any] struct {
	*registry
	reader avro.Schema
}

// RegistryAvro returns the codec of T as Avro in the Confluent wire format,
// through the schema registry of r, with schema (its JSON text) as T's
// schema.
//
// Encode writes in schema, framed with the id of schema under the topic's
// subject (looked up, or registered when r.AutoRegister is set; the id is
// cached per subject). Decode reads the schema id of each payload, fetches
// that writer's schema from the registry the first time it is seen (cached
// in an sr.Serde), and reads the payload through Avro schema resolution
// into schema: a payload written with an older or newer compatible schema
// decodes into T. A wrong magic byte, an id the registry does not have, a
// writer's schema schema cannot read, or a truncated body is a decode
// failure. A schema that does not parse, or a nil r.Client, is an error
// here.
func RegistryAvro[T any](r Registry, schema string) (Codec[T], error) {
	s, err := avro.Parse(schema)
	if err != nil {
		return nil, fmt.Errorf("codec: the Avro schema does not parse; give its JSON text: %w", err)
	}
	var record string
	if n, ok := s.(avro.NamedSchema); ok {
		record = n.FullName()
	}
	reg, err := newRegistry(r, FormatAvro, sr.TypeAvro, schema, record)
	if err != nil {
		return nil, err
	}
	return &registryAvro[T]{registry: reg, reader: s}, nil
}

// Encode returns v in the wire format.
func (c *registryAvro[T]) Encode(ctx context.Context, topic string, v T) ([]byte, error) {
	s, err := c.encoder(ctx, topic, func(s *sr.Serde, id int) {
		s.Register(id, *new(T), sr.EncodeFn(func(v any) ([]byte, error) { return avro.Marshal(c.reader, v) }))
	})
	if err != nil {
		return nil, err
	}
	return s.Encode(v)
}

// Decode reads data, in the wire format, as a T.
func (c *registryAvro[T]) Decode(ctx context.Context, _ string, data []byte) (T, error) {
	var v T
	err := c.decode(ctx, data, &v, *new(T), c.build)
	return v, err
}

// build returns the decoder of payloads written in the writer's schema sch.
func (c *registryAvro[T]) build(sch sr.Schema) (decodeFn, error) {
	if len(sch.References) > 0 {
		return nil, fmt.Errorf("the writer's schema has references, which this codec does not resolve")
	}
	w, err := avro.ParseWithCache(sch.Schema, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("the writer's schema does not parse: %w", err)
	}
	resolved, err := avro.NewSchemaCompatibility().Resolve(c.reader, w)
	if err != nil {
		return nil, fmt.Errorf("the writer's schema cannot be read as the reader's: %w", err)
	}
	return func(body []byte, into any) error { return avro.Unmarshal(resolved, body, into) }, nil
}
