package codec

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/kscope-dev/kscope/retrytopic"
)

// SubjectNameStrategy returns the registry subject under which the schema
// of a record's key (key true) or value is registered, from the record's
// topic and the schema's record name (an Avro record's full name, a
// Protobuf message's full name). [TopicName], [RecordName] and
// [TopicRecordName] are Confluent's strategies of the same names.
type SubjectNameStrategy func(topic string, key bool, record string) string

// TopicName is the subject "<topic>-key" or "<topic>-value": one schema
// (and its versions) per topic. It is the default.
func TopicName(topic string, key bool, _ string) string {
	if key {
		return topic + "-key"
	}
	return topic + "-value"
}

// RecordName is the subject "<record>": one schema per record type, in
// whatever topic.
func RecordName(_ string, _ bool, record string) string { return record }

// TopicRecordName is the subject "<topic>-<record>": one schema per record
// type and topic.
func TopicRecordName(topic string, _ bool, record string) string { return topic + "-" + record }

// Registry says how a registry codec ([RegistryAvro], [RegistryProto])
// reaches the schema registry and names its subjects.
type Registry struct {
	// Client is the registry's client (sr.NewClient(sr.URLs(...)));
	// required. Its requests use the ctx given to Encode and Decode.
	Client *sr.Client
	// Subject names the subject of a topic's schema. Default: TopicName.
	Subject SubjectNameStrategy
	// Key says the codec is for record keys, not values (TopicName's
	// "-key" subject).
	Key bool
	// AutoRegister makes Encode register the codec's schema under its
	// subject (idempotent: an identical schema gets its existing id; the
	// registry refuses one its compatibility rule forbids). Without it,
	// Encode looks the schema up under its subject and fails if it is not
	// registered there: the usual setting where schemas are registered by
	// a deployment step. A codec given no schema text uses the subject's
	// latest version instead.
	AutoRegister bool
}

// registry is what the registry codecs share: the subjects' schema ids
// for Encode, each in an sr.Serde of its own (an id per subject), and one
// sr.Serde of the ids seen by Decode, each with the decoder built from its
// schema the first time it is seen.
type registry struct {
	Registry
	format string
	typ    sr.SchemaType
	schema string // the schema's text; empty: the subject's latest version
	record string // the schema's record name, for the subject strategies

	dec   *sr.Serde  // the ids seen by Decode, with their decoders
	learn sync.Mutex // one registry lookup of an id at a time

	encMu sync.Mutex
	enc   sync.Map // subject → *sr.Serde holding that subject's id
}

// newRegistry checks r and returns the shared part of a registry codec.
func newRegistry(r Registry, format string, typ sr.SchemaType, schema, record string) (*registry, error) {
	if r.Client == nil {
		return nil, errors.New("codec: Registry.Client is nil; give it the registry's client, sr.NewClient(sr.URLs(\"http://registry:8081\"))")
	}
	if r.AutoRegister && schema == "" {
		return nil, fmt.Errorf("codec: Registry.AutoRegister is set but the %s codec has no schema text to register; give it the schema or unset AutoRegister", format)
	}
	if r.Subject == nil {
		r.Subject = TopicName
	}
	return &registry{Registry: r, format: format, typ: typ, schema: schema, record: record, dec: sr.NewSerde()}, nil
}

// encoder returns the sr.Serde that encodes with the schema id of topic's
// subject, finding the id in the registry the first time.
func (r *registry) encoder(ctx context.Context, topic string, register func(s *sr.Serde, id int)) (*sr.Serde, error) {
	subject := r.Subject(topic, r.Key, r.record)
	if s, ok := r.enc.Load(subject); ok {
		return s.(*sr.Serde), nil
	}
	r.encMu.Lock()
	defer r.encMu.Unlock()
	if s, ok := r.enc.Load(subject); ok {
		return s.(*sr.Serde), nil
	}
	id, err := r.subjectID(ctx, subject)
	if err != nil {
		return nil, err
	}
	s := sr.NewSerde()
	register(s, id)
	r.enc.Store(subject, s)
	return s, nil
}

// subjectID returns the id of the codec's schema under subject: registered
// (AutoRegister), looked up, or the subject's latest.
func (r *registry) subjectID(ctx context.Context, subject string) (int, error) {
	var (
		ss  sr.SubjectSchema
		err error
		how string
	)
	switch {
	case r.schema == "":
		ss, err = r.Client.SchemaByVersion(ctx, subject, -1)
		how = "has no version of subject %q; register the schema there first"
	case r.AutoRegister:
		ss, err = r.Client.CreateSchema(ctx, subject, sr.Schema{Schema: r.schema, Type: r.typ})
		how = "refused to register the schema under subject %q (see its compatibility rule)"
	default:
		ss, err = r.Client.LookupSchema(ctx, subject, sr.Schema{Schema: r.schema, Type: r.typ})
		how = "does not have this schema under subject %q; register it there (or set Registry.AutoRegister)"
	}
	if err != nil {
		return 0, fmt.Errorf("codec: the schema registry "+how+": %w", subject, err)
	}
	return ss.ID, nil
}

// decodeFn decodes a payload's body (after the wire-format header) into
// the codec's *T.
type decodeFn = func(body []byte, into any) error

// known makes sure Decode knows schema id: looked up in the registry and
// built into a decoder by build the first time it is seen. An id the
// registry does not have is a decode failure (and not cached: it may be
// registered later); a registry that does not answer is a retryable error.
// A schema build refuses is cached as a decoder that always fails.
func (r *registry) known(ctx context.Context, id int, zero any, build func(sr.Schema) (decodeFn, error)) error {
	if r.dec.IsRegistered(id, sr.DecodeFn) {
		return nil
	}
	r.learn.Lock()
	defer r.learn.Unlock()
	if r.dec.IsRegistered(id, sr.DecodeFn) {
		return nil
	}
	sch, err := r.Client.SchemaByID(ctx, id)
	if err != nil {
		if re, ok := errors.AsType[*sr.ResponseError](err); ok && re.StatusCode == http.StatusNotFound {
			return incompatible(failID(r.format, id, fmt.Errorf("the schema registry has no schema id %d: %w", id, err)))
		}
		return retrytopic.Retryable(fmt.Errorf("codec: looking up schema id %d in the schema registry: %w", id, err))
	}
	var fn decodeFn
	if sch.Type != r.typ {
		err = fmt.Errorf("schema id %d is a %s schema, not %s", id, sch.Type, r.typ)
	} else {
		fn, err = build(sch)
	}
	if err != nil {
		refused := incompatible(failID(r.format, id, err))
		fn = func([]byte, any) error { return refused }
	}
	r.dec.Register(id, zero, sr.DecodeFn(fn))
	return nil
}

// decode decodes data, a payload in the wire format, into into (a *T).
func (r *registry) decode(ctx context.Context, data []byte, into, zero any, build func(sr.Schema) (decodeFn, error)) error {
	id, _, err := r.dec.DecodeID(data)
	if err != nil {
		return fail(r.format, fmt.Errorf("no Confluent wire-format header (a magic byte 0, then a 4-byte schema id): %w", err))
	}
	if err := r.known(ctx, id, zero, build); err != nil {
		return err
	}
	if err := r.dec.Decode(data, into); err != nil {
		if _, ok := retrytopic.AsDecodeFailure(err); ok {
			return err
		}
		return failID(r.format, id, err)
	}
	return nil
}
