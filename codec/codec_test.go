package codec_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kscope-dev/kscope/codec"
	"github.com/kscope-dev/kscope/retrytopic"
)

type order struct {
	ID    string `json:"id" avro:"id"`
	Cents int64  `json:"cents" avro:"cents"`
}

// orderV2 is order's next version: a field added with a default.
type orderV2 struct {
	ID    string `avro:"id"`
	Cents int64  `avro:"cents"`
	Note  string `avro:"note"`
}

const (
	orderSchema   = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"cents","type":"long"}]}`
	orderV2Schema = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"cents","type":"long"},{"name":"note","type":"string","default":"none"}]}`
	// An Order whose id is an int: no reader of orderSchema can read it.
	orderIntSchema = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"int"}]}`
)

// decodeFailure fails t unless err is a decode failure of format, naming
// schema id (id < 0: naming none).
func decodeFailure(t *testing.T, err error, format string, id int) {
	t.Helper()
	var f *codec.DecodeFailure
	if !errors.As(err, &f) {
		t.Fatalf("error %v (%T) is not a DecodeFailure", err, err)
	}
	if f.Format != format || f.HasSchemaID != (id >= 0) || (id >= 0 && f.SchemaID != id) {
		t.Fatalf("decode failure %+v: want format %q, schema id %d", f, format, id)
	}
	if retrytopic.ClassOf(err) != retrytopic.ClassTerminal {
		t.Fatalf("a decode failure is classed %v, want terminal", retrytopic.ClassOf(err))
	}
}

func roundTrip[T any](t *testing.T, c codec.Codec[T], topic string, v T) []byte {
	t.Helper()
	ctx := context.Background()
	b, err := c.Encode(ctx, topic, v)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Decode(ctx, topic, b)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := any(v).(proto.Message); ok {
		if !proto.Equal(m, any(got).(proto.Message)) {
			t.Fatalf("decoded %v, want %v", got, v)
		}
	} else if !reflect.DeepEqual(got, v) {
		t.Fatalf("decoded %+v, want %+v", got, v)
	}
	return b
}

func TestPlainCodecsRoundTripAndRefusePoison(t *testing.T) {
	ctx := context.Background()
	o := order{ID: "o-1", Cents: 1250}

	js := codec.JSON[order]()
	roundTrip(t, js, "orders", o)
	_, err := js.Decode(ctx, "orders", []byte("<order/>"))
	decodeFailure(t, err, codec.FormatJSON, -1)
	strict := codec.StrictJSON[order]()
	roundTrip(t, strict, "orders", o)
	_, err = strict.Decode(ctx, "orders", []byte(`{"id":"o-1","extra":1}`))
	decodeFailure(t, err, codec.FormatJSON, -1)

	pb := codec.Proto[*wrapperspb.StringValue]()
	roundTrip(t, pb, "names", wrapperspb.String("ada"))
	_, err = pb.Decode(ctx, "names", []byte{0xff, 0xff, 0xff})
	decodeFailure(t, err, codec.FormatProtobuf, -1)

	av, err := codec.Avro[order](orderSchema)
	if err != nil {
		t.Fatal(err)
	}
	b := roundTrip(t, av, "orders", o)
	_, err = av.Decode(ctx, "orders", b[:3])
	decodeFailure(t, err, codec.FormatAvro, -1)

	if _, err := codec.Avro[order](`{"type":"record"`); err == nil || !strings.Contains(err.Error(), "does not parse") {
		t.Fatalf("a broken Avro schema: %v, want a construction error saying it does not parse", err)
	}
}

// registry returns a client of a fresh in-process schema registry.
func registry(t *testing.T) (*srfake.Registry, *sr.Client) {
	t.Helper()
	reg := srfake.New()
	t.Cleanup(reg.Close)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	return reg, cl
}

func TestRegistryAvroRoundTripAndEvolution(t *testing.T) {
	ctx := context.Background()
	reg, cl := registry(t)
	v1, err := codec.RegistryAvro[order](codec.Registry{Client: cl, AutoRegister: true}, orderSchema)
	if err != nil {
		t.Fatal(err)
	}
	b := roundTrip(t, v1, "orders", order{ID: "o-1", Cents: 5})
	id1, _, err := sr.NewSerde().DecodeID(b)
	if err != nil {
		t.Fatalf("the payload is not in the wire format: %v", err)
	}
	if got, ok := reg.GetSchema("orders-value", 1); !ok || got.ID != id1 {
		t.Fatalf("subject orders-value version 1 = %+v, want the schema of id %d", got, id1)
	}

	// A reader on the next version reads the old payload with the new
	// field's default, and the old reader reads a new payload.
	v2, err := codec.RegistryAvro[orderV2](codec.Registry{Client: cl, AutoRegister: true}, orderV2Schema)
	if err != nil {
		t.Fatal(err)
	}
	got, err := v2.Decode(ctx, "orders", b)
	if err != nil || got != (orderV2{ID: "o-1", Cents: 5, Note: "none"}) {
		t.Fatalf("v2 read a v1 payload as %+v, %v", got, err)
	}
	b2, err := v2.Encode(ctx, "orders", orderV2{ID: "o-2", Cents: 7, Note: "gift"})
	if err != nil {
		t.Fatal(err)
	}
	if id2, _, _ := sr.NewSerde().DecodeID(b2); id2 == id1 {
		t.Fatalf("v2 encoded with v1's schema id %d", id1)
	}
	if old, err := v1.Decode(ctx, "orders", b2); err != nil || old != (order{ID: "o-2", Cents: 7}) {
		t.Fatalf("v1 read a v2 payload as %+v, %v", old, err)
	}
}

func TestRegistryAvroPoison(t *testing.T) {
	ctx := context.Background()
	reg, cl := registry(t)
	c, err := codec.RegistryAvro[order](codec.Registry{Client: cl, AutoRegister: true}, orderSchema)
	if err != nil {
		t.Fatal(err)
	}
	good, err := c.Encode(ctx, "orders", order{ID: "o-1", Cents: 99})
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := sr.NewSerde().DecodeID(good)
	intID, _, err := reg.RegisterSchema("other-value", sr.Schema{Schema: orderIntSchema})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		payload []byte
		id      int
		// incompatible: the schema is at fault, not the bytes
		// (hook.ReasonSchemaIncompatible)
		incompatible bool
	}{
		{"wrong magic byte", append([]byte{1}, good[1:]...), -1, false},
		{"shorter than the header", good[:3], -1, false},
		{"unknown schema id", []byte{0, 0, 0, 0x30, 0x39, 2, 'x'}, 12345, true},
		{"truncated body", good[:7], id, false},
		{"schema the reader cannot read", append([]byte{0, 0, 0, 0, byte(intID)}, 2), intID, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Decode(ctx, "orders", tc.payload)
			decodeFailure(t, err, codec.FormatAvro, tc.id)
			if f, _ := retrytopic.AsDecodeFailure(err); f.Incompatible != tc.incompatible {
				t.Errorf("Incompatible = %v, want %v (%v)", f.Incompatible, tc.incompatible, err)
			}
		})
	}
	if got, err := c.Decode(ctx, "orders", good); err != nil || got.ID != "o-1" {
		t.Fatalf("after the poison, a good payload decoded as %+v, %v", got, err)
	}
}

// A registry that does not answer is not the payload's fault: the error
// is retryable, not a decode failure.
func TestRegistryDownIsRetryable(t *testing.T) {
	reg, cl := registry(t)
	c, err := codec.RegistryAvro[order](codec.Registry{Client: cl}, orderSchema)
	if err != nil {
		t.Fatal(err)
	}
	reg.Close()
	_, err = c.Decode(context.Background(), "orders", []byte{0, 0, 0, 0, 1, 2, 'x'})
	if _, ok := retrytopic.AsDecodeFailure(err); ok || retrytopic.ClassOf(err) != retrytopic.ClassRetryable {
		t.Fatalf("with the registry down: %v (class %v), want a retryable error that is no decode failure", err, retrytopic.ClassOf(err))
	}
}

func TestRegistryEncodeNeedsTheSchemaRegistered(t *testing.T) {
	reg, cl := registry(t)
	c, err := codec.RegistryAvro[order](codec.Registry{Client: cl, Subject: codec.RecordName}, orderSchema)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Encode(context.Background(), "orders", order{ID: "o"}); err == nil || !strings.Contains(err.Error(), `subject "shop.Order"`) {
		t.Fatalf("encoding with an unregistered schema: %v, want an error naming subject shop.Order", err)
	}
	id, _, err := reg.RegisterSchema("shop.Order", sr.Schema{Schema: orderSchema})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Encode(context.Background(), "orders", order{ID: "o"})
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := sr.NewSerde().DecodeID(b); got != id {
		t.Fatalf("encoded with schema id %d, want the registered %d", got, id)
	}
}

// wrappersProto stands for the text of google/protobuf/wrappers.proto as a
// deployment step registers it.
const wrappersProto = `syntax = "proto3"; package google.protobuf; message DoubleValue { double value = 1; } message FloatValue { float value = 1; } message Int64Value { int64 value = 1; } message UInt64Value { uint64 value = 1; } message Int32Value { int32 value = 1; } message UInt32Value { uint32 value = 1; } message BoolValue { bool value = 1; } message StringValue { string value = 1; } message BytesValue { bytes value = 1; }`

func TestRegistryProto(t *testing.T) {
	ctx := context.Background()
	reg, cl := registry(t)
	c, err := codec.RegistryProto[*wrapperspb.StringValue](codec.Registry{Client: cl, AutoRegister: true}, wrappersProto)
	if err != nil {
		t.Fatal(err)
	}
	b := roundTrip(t, c, "names", wrapperspb.String("ada"))
	id, rest, err := sr.NewSerde().DecodeID(b)
	if err != nil {
		t.Fatal(err)
	}
	// StringValue is the eighth message of its file: index [7].
	if index, _, err := (&sr.ConfluentHeader{}).DecodeIndex(rest, 4); err != nil || !reflect.DeepEqual(index, []int{7}) {
		t.Fatalf("message index %v, %v: want [7]", index, err)
	}
	// A reader of the subject's latest version, without the schema text.
	latest, err := codec.RegistryProto[*wrapperspb.StringValue](codec.Registry{Client: cl}, "")
	if err != nil {
		t.Fatal(err)
	}
	b2, err := latest.Encode(ctx, "names", wrapperspb.String("bob"))
	if err != nil || !reflect.DeepEqual(b2[:5], b[:5]) {
		t.Fatalf("encoding with the subject's latest: % x, %v; want schema id %d", b2, err, id)
	}

	avroID, _, err := reg.RegisterSchema("orders-value", sr.Schema{Schema: orderSchema})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		payload []byte
		id      int
	}{
		{"another message of the schema", append([]byte{0, 0, 0, 0, byte(id), 0}, rest[1:]...), id},
		{"an Avro schema id", append([]byte{0, 0, 0, 0, byte(avroID)}, rest...), avroID},
		{"a body that does not parse", append(b[:7:7], 0xff, 0xff), id},
		{"wrong magic byte", append([]byte{9}, b[1:]...), -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Decode(ctx, "names", tc.payload)
			decodeFailure(t, err, codec.FormatProtobuf, tc.id)
		})
	}
}

func TestRegistryConfigErrors(t *testing.T) {
	_, cl := registry(t)
	for name, err := range map[string]error{
		"no client":                  second(codec.RegistryAvro[order](codec.Registry{}, orderSchema)),
		"auto-register without text": second(codec.RegistryProto[*wrapperspb.StringValue](codec.Registry{Client: cl, AutoRegister: true}, "")),
	} {
		if err == nil || !strings.HasPrefix(err.Error(), "codec: ") || !strings.Contains(err.Error(), "; ") {
			t.Errorf("%s: %v, want a construction error saying what to change", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }

func TestSubjectNameStrategies(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{codec.TopicName("orders", false, "shop.Order"), "orders-value"},
		{codec.TopicName("orders", true, "shop.Order"), "orders-key"},
		{codec.RecordName("orders", false, "shop.Order"), "shop.Order"},
		{codec.TopicRecordName("orders", false, "shop.Order"), "orders-shop.Order"},
	} {
		if tc.got != tc.want {
			t.Errorf("subject %q, want %q", tc.got, tc.want)
		}
	}
}
