// Package codec turns record payloads into typed values and back, for
// kscope's typed handlers (consumer.Typed, dbscope.Typed, txn.Typed) and
// typed outputs (txn.EmitValue, outbox.AddValue).
//
// A [Codec] encodes and decodes one Go type. The plain codecs read and
// write bare payloads: [JSON], [Proto] (google.golang.org/protobuf) and
// [Avro] (github.com/hamba/avro/v2). The registry codecs, [RegistryAvro]
// and [RegistryProto], read and write the Confluent wire format (a magic
// byte 0, the 4-byte schema id, for Protobuf the message index, then the
// payload) through a schema registry, with franz-go's pkg/sr: its Client
// for the registry's API and its Serde for the framing and the
// per-id encoders and decoders, which it caches.
//
// A payload a codec cannot decode — not valid in its format, without the
// wire-format header (a wrong magic byte, fewer than 5 bytes), naming a
// schema id the registry does not have, or a schema the reader's schema
// cannot read — makes Decode return a *[DecodeFailure]. A typed handler
// turns it into a consumer.DecodeError: the record goes to the dead-letter
// topic at once, its key, value and headers unchanged, with the headers
// retrytopic.HeaderDecodeError, HeaderDecodeFormat and HeaderSchemaID,
// and is counted (consumer.FailureStats.DecodeFailures,
// kscope_decode_failures_total). The last two, the schema's fault rather
// than the bytes', have DecodeFailure.Incompatible set: their dead letters
// count as schema_incompatible in kscope_dead_letters_total, the others as
// deserialization_failure. A registry that does not answer is not
// the payload's fault: Decode then returns a retryable error and the
// record is retried.
package codec
