package codec_test

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kscope-dev/kscope/codec"
)

// A JSON codec of a Go struct.
func ExampleJSON() {
	type Order struct {
		ID    string `json:"id"`
		Cents int64  `json:"cents"`
	}
	c := codec.JSON[Order]()
	ctx := context.Background()
	b, _ := c.Encode(ctx, "orders", Order{ID: "o-1", Cents: 1250})
	fmt.Println(string(b))
	_, err := c.Decode(ctx, "orders", []byte("<order/>"))
	fmt.Println(err != nil)
	// Output:
	// {"id":"o-1","cents":1250}
	// true
}

// A plain Avro codec: bare Avro binary in one schema.
func ExampleAvro() {
	type Order struct {
		ID    string `avro:"id"`
		Cents int64  `avro:"cents"`
	}
	c, err := codec.Avro[Order](`{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"cents","type":"long"}]}`)
	if err != nil {
		panic(err)
	}
	b, _ := c.Encode(context.Background(), "orders", Order{ID: "o-1", Cents: 1250})
	o, _ := c.Decode(context.Background(), "orders", b)
	fmt.Printf("%d bytes, %+v\n", len(b), o)
	// Output: 6 bytes, {ID:o-1 Cents:1250}
}

// A Protobuf codec of a generated message type.
func ExampleProto() {
	c := codec.Proto[*wrapperspb.StringValue]()
	b, _ := c.Encode(context.Background(), "names", wrapperspb.String("ada"))
	v, _ := c.Decode(context.Background(), "names", b)
	fmt.Println(v.GetValue())
	// Output: ada
}

// Avro in the Confluent wire format, through a schema registry (here
// franz-go's in-process srfake; in production sr.URLs of the real one).
// Encode registers the schema under "orders-value" (TopicName); a payload
// whose schema id the registry does not have is a DecodeFailure.
func ExampleRegistryAvro() {
	reg := srfake.New()
	defer reg.Close()
	cl, _ := sr.NewClient(sr.URLs(reg.URL()))

	type Order struct {
		ID string `avro:"id"`
	}
	c, err := codec.RegistryAvro[Order](codec.Registry{Client: cl, AutoRegister: true},
		`{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"}]}`)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	b, _ := c.Encode(ctx, "orders", Order{ID: "o-1"})
	o, _ := c.Decode(ctx, "orders", b)
	fmt.Printf("magic %d, schema id %d, %+v\n", b[0], int(b[4]), o)

	_, err = c.Decode(ctx, "orders", []byte{0, 0, 0, 0, 42, 2, 'x'})
	fmt.Println(err)
	// Output:
	// magic 0, schema id 1, {ID:o-1}
	// decode avro (schema id 42): the schema registry has no schema id 42: schema not found
}

// Protobuf in the Confluent wire format, with the schema registered by a
// deployment step: Encode looks the schema up under the topic's subject.
func ExampleRegistryProto() {
	reg := srfake.New()
	defer reg.Close()
	const proto = `syntax = "proto3"; package google.protobuf; message DoubleValue { double value = 1; } message FloatValue { float value = 1; } message Int64Value { int64 value = 1; } message UInt64Value { uint64 value = 1; } message Int32Value { int32 value = 1; } message UInt32Value { uint32 value = 1; } message BoolValue { bool value = 1; } message StringValue { string value = 1; } message BytesValue { bytes value = 1; }`
	if _, _, err := reg.RegisterSchema("names-value", sr.Schema{Schema: proto, Type: sr.TypeProtobuf}); err != nil {
		panic(err)
	}
	cl, _ := sr.NewClient(sr.URLs(reg.URL()))
	c, err := codec.RegistryProto[*wrapperspb.StringValue](codec.Registry{Client: cl}, proto)
	if err != nil {
		panic(err)
	}
	b, err := c.Encode(context.Background(), "names", wrapperspb.String("ada"))
	if err != nil {
		panic(err)
	}
	v, _ := c.Decode(context.Background(), "names", b)
	fmt.Printf("% x | %s\n", b[:7], v.GetValue())
	// Output: 00 00 00 00 01 02 0e | ada
}

// A typed record for an Emitter or an outbox: the value encoded with a
// codec.
func ExampleNewRecord() {
	rec, err := codec.NewRecord(context.Background(), codec.JSON[map[string]int](), "totals", []byte("k"), map[string]int{"cents": 5})
	fmt.Println(rec.Topic, string(rec.Value), err)
	// Output: totals {"cents":5} <nil>
}

// The subject of a topic's value schema under each strategy.
func ExampleSubjectNameStrategy() {
	for _, s := range []codec.SubjectNameStrategy{codec.TopicName, codec.RecordName, codec.TopicRecordName} {
		fmt.Println(s("orders", false, "shop.Order"))
	}
	// Output:
	// orders-value
	// shop.Order
	// orders-shop.Order
}
