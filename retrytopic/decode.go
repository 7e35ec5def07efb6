package retrytopic

import (
	"errors"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Header names of a decode failure, on a dead-letter record routed because
// its payload could not be decoded (a [DecodeFailure], which every
// [DecodeError] is).
const (
	HeaderDecodeError  = "kscope-decode-error"  // "1": the payload could not be decoded
	HeaderDecodeFormat = "kscope-decode-format" // the payload's format ("json", "avro", "protobuf"), when the codec said
	HeaderSchemaID     = "kscope-schema-id"     // the schema id the payload named (Confluent wire format), when it named one
)

// DecodeFailure says a record's payload could not be decoded: it is not
// valid in its format, it lacks the Confluent wire-format header (magic
// byte 0 and a 4-byte schema id), it names a schema id the registry does
// not have, or a schema the reader's cannot read. The codecs of package
// codec return it; [DecodeError] wraps any other error in one. It is
// terminal: the record goes to the dead-letter topic at once, its raw
// bytes unchanged, with [HeaderDecodeError], [HeaderDecodeFormat] and
// [HeaderSchemaID], and is counted as a decode failure
// (consumer.FailureStats.DecodeFailures, hook.EventDecodeFailure).
type DecodeFailure struct {
	Err         error  // what went wrong
	Format      string // "json", "avro", "protobuf"; empty when unknown
	SchemaID    int    // the schema id the payload named, when HasSchemaID
	HasSchemaID bool   // the payload carried a wire-format header with a schema id
	// Incompatible says the payload is not at fault by itself: it names
	// a schema the reader cannot use (a schema id the registry does not
	// have, or a schema the reader's cannot read). Such a dead letter
	// counts as hook.ReasonSchemaIncompatible, any other as
	// hook.ReasonDeserializationFailure.
	Incompatible bool
}

// Error says what could not be decoded and why: "decode: " and the cause
// for a failure with no format, else "decode avro (schema id 7): " and the
// cause.
func (e *DecodeFailure) Error() string {
	var b strings.Builder
	b.WriteString("decode")
	if e.Format != "" {
		b.WriteString(" " + e.Format)
	}
	if e.HasSchemaID {
		b.WriteString(" (schema id " + strconv.Itoa(e.SchemaID) + ")")
	}
	b.WriteString(": ")
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("malformed payload")
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *DecodeFailure) Unwrap() error { return e.Err }

// decodeFailure returns the DecodeFailure in err's chain, or nil.
func decodeFailure(err error) *DecodeFailure {
	if err == nil {
		return nil
	}
	f, _ := errors.AsType[*DecodeFailure](err)
	return f
}

// AsDecodeFailure returns the DecodeFailure in err's chain, if any.
func AsDecodeFailure(err error) (*DecodeFailure, bool) {
	f := decodeFailure(err)
	return f, f != nil
}

// DecodeMetadata copies the DecodeFailure in err's chain, if any, into m's
// decode fields, and clears them otherwise: a record routed for another
// reason carries no decode headers, even if an earlier hop's did.
func (m *Metadata) DecodeMetadata(err error) {
	m.Undecodable, m.DecodeFormat, m.SchemaID = false, "", -1
	if f := decodeFailure(err); f != nil {
		m.Undecodable, m.DecodeFormat = true, f.Format
		if f.HasSchemaID {
			m.SchemaID = f.SchemaID
		}
	}
}

// appendDecode appends m's decode headers to out.
func (m Metadata) appendDecode(out []kgo.RecordHeader) []kgo.RecordHeader {
	if !m.Undecodable {
		return out
	}
	out = append(out, kgo.RecordHeader{Key: HeaderDecodeError, Value: []byte("1")})
	if m.DecodeFormat != "" {
		out = append(out, kgo.RecordHeader{Key: HeaderDecodeFormat, Value: []byte(truncate(m.DecodeFormat, 64))})
	}
	if m.SchemaID >= 0 {
		out = append(out, kgo.RecordHeader{Key: HeaderSchemaID, Value: []byte(strconv.Itoa(m.SchemaID))})
	}
	return out
}

// decode reads the decode headers into m.
func (d *headerDecoder) decode(m *Metadata) {
	if v, ok := d.header(HeaderDecodeError); ok {
		m.Undecodable = string(v) == "1"
	}
	if v, ok := d.header(HeaderDecodeFormat); ok {
		m.DecodeFormat = truncate(string(v), 64)
	}
	if v, ok := d.header(HeaderSchemaID); ok {
		n, err := strconv.ParseUint(string(v), 10, 32)
		if err != nil {
			d.bad(HeaderSchemaID, v)
		} else {
			m.SchemaID = int(n)
		}
	}
}
