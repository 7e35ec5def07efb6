package retrytopic_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// A decode failure's format and schema id travel in the routed record's
// headers and read back; a record routed later for another reason loses
// them; any DecodeError is a terminal DecodeFailure, its message unchanged.
func TestDecodeFailureHeaders(t *testing.T) {
	src := &kgo.Record{Topic: "orders", Value: []byte{1, 2}, Timestamp: time.UnixMilli(1_700_000_000_000)}
	m, err := retrytopic.FromRecord(src, "id-1")
	if err != nil || m.Undecodable || m.SchemaID != -1 {
		t.Fatalf("a first hop: %+v, %v; want no decode metadata", m, err)
	}
	fail := fmt.Errorf("handler: %w", &retrytopic.DecodeFailure{Err: errors.New("truncated"), Format: "avro", SchemaID: 0, HasSchemaID: true})
	m.DecodeMetadata(fail)
	routed := &kgo.Record{Topic: "dlt", Value: src.Value, Headers: m.Headers(nil, false)}
	back, err := retrytopic.FromRecord(routed, "")
	if err != nil || !back.Undecodable || back.DecodeFormat != "avro" || back.SchemaID != 0 {
		t.Fatalf("read back %+v, %v: want an avro decode failure of schema id 0", back, err)
	}
	back.DecodeMetadata(errors.New("a timeout"))
	for _, h := range back.Headers(routed.Headers, false) {
		if h.Key == retrytopic.HeaderDecodeError || h.Key == retrytopic.HeaderSchemaID || h.Key == retrytopic.HeaderDecodeFormat {
			t.Fatalf("a record routed for another reason carries %s", h.Key)
		}
	}

	plain := retrytopic.DecodeError(errors.New("invalid JSON at byte 3"))
	f, ok := retrytopic.AsDecodeFailure(plain)
	if !ok || f.HasSchemaID || plain.Error() != "decode: invalid JSON at byte 3" || retrytopic.ClassOf(plain) != retrytopic.ClassTerminal {
		t.Fatalf("DecodeError: %q (%+v, %v), class %v", plain, f, ok, retrytopic.ClassOf(plain))
	}
	if wrapped := retrytopic.DecodeError(fail); !errors.Is(wrapped, errors.Unwrap(fail)) || wrapped.Error() != "handler: decode avro (schema id 0): truncated" {
		t.Fatalf("DecodeError of a codec's failure: %q", wrapped)
	}
	if _, err := retrytopic.FromRecord(&kgo.Record{Headers: []kgo.RecordHeader{{Key: retrytopic.HeaderSchemaID, Value: []byte("-3")}}}, ""); err == nil {
		t.Fatal("a malformed schema id header was not reported")
	}
}
