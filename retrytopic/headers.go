package retrytopic

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Header names of the failure metadata kscope adds to a routed record, next
// to the identity and original coordinates (HeaderID, HeaderOriginalTopic,
// ...). All values are UTF-8 text; times are Unix milliseconds in decimal.
const (
	HeaderGroup        = "kscope-group"         // consumer group that failed the record
	HeaderAttempt      = "kscope-attempt"       // attempts made so far, 1 for the first failure
	HeaderFirstFailure = "kscope-first-failure" // time of the first failure
	HeaderLastFailure  = "kscope-last-failure"  // time of the latest failure
	HeaderError        = "kscope-error"         // the latest error message, truncated to MaxErrorLength
	HeaderErrorClass   = "kscope-error-class"   // Class of the latest error
	HeaderDue          = "kscope-due"           // on retry topics: not to be handled before this time
	HeaderStage        = "kscope-stage"         // on retry topics: the ladder step, from 0
	HeaderParked       = "kscope-parked"        // "1": the record did not fail, it waits behind an earlier record of its key
	HeaderOriginalKey  = "kscope-original-key"  // the original key, truncated to MaxKeyLength
	HeaderRedrive      = "kscope-redrive"       // audit note of a redrive: who, when, from where
)

// Spring Kafka's dead-letter header names, written as well when
// Router.SpringHeaders is set, so tools built for Spring read kscope's DLT.
// Partition is a 4-byte and offset and timestamp 8-byte big-endian integer,
// as Spring writes them.
const (
	SpringOriginalTopic     = "kafka_dlt-original-topic"
	SpringOriginalPartition = "kafka_dlt-original-partition"
	SpringOriginalOffset    = "kafka_dlt-original-offset"
	SpringOriginalTimestamp = "kafka_dlt-original-timestamp"
	SpringOriginalGroup     = "kafka_dlt-original-consumer-group"
	SpringExceptionMessage  = "kafka_dlt-exception-message"
	SpringExceptionFQCN     = "kafka_dlt-exception-fqcn"
)

// Bounds on header values, so that a routed record stays a sane size
// whatever the error or the key.
const (
	MaxErrorLength = 1024
	MaxKeyLength   = 256
	// MaxAttempt bounds a decoded attempt count: a forged huge count reads
	// as this, which exhausts any budget and sends the record to the DLT
	// instead of looping.
	MaxAttempt = 1000
)

// maxStage is the highest retry-topic stage a record's HeaderStage may
// name: a Ladder has at most maxStage+1 delays.
const maxStage = 64

// Metadata is what kscope knows about a record's failures, carried in its
// headers from hop to hop.
type Metadata struct {
	ID                string
	OriginalTopic     string
	OriginalPartition int32
	OriginalOffset    int64
	OriginalTimestamp time.Time
	OriginalKey       []byte
	Group             string
	Attempt           int
	FirstFailure      time.Time
	LastFailure       time.Time
	Error             string
	Class             Class
	Due               time.Time // zero when not set
	Stage             int       // -1 when not set
	Parked            bool
	// ExpectedVersion and ActualVersion describe the version gap the
	// record was routed for (both 0 when none).
	ExpectedVersion, ActualVersion int64
	// Undecodable says the record was routed because its payload could
	// not be decoded (a DecodeFailure); DecodeFormat is the payload's
	// format when known, SchemaID the schema id it named (-1 when none).
	Undecodable  bool
	DecodeFormat string
	SchemaID     int
	// Owner is the team that owns the group that routed the record, and
	// how to reach it (HeaderOwner; "" when the group declares none).
	Owner string
	// DeliveryCount is how many times a share group's broker had
	// delivered the record when it was routed (HeaderDeliveryCount; 0 for
	// a consumer group's record).
	DeliveryCount int32
}

// FromRecord returns the metadata r carries, filling in what it does not
// carry from r itself (a record on its first failure carries nothing yet):
// id (the record's identity, from consumer.Identity), its own coordinates as
// the original ones. Malformed kscope headers are reported as an error and
// ignored field by field, so a corrupt or forged header can make a record
// go to the DLT, never block it. The returned OriginalKey shares r's memory
// (its key, or its header), cut to MaxKeyLength.
func FromRecord(r *kgo.Record, id string) (Metadata, error) {
	m := Metadata{
		ID:                id,
		OriginalTopic:     r.Topic,
		OriginalPartition: r.Partition,
		OriginalOffset:    r.Offset,
		OriginalTimestamp: r.Timestamp,
		OriginalKey:       clip(r.Key, MaxKeyLength),
		Stage:             -1,
		SchemaID:          -1,
	}
	if !hasKscopeHeader(r.Headers) {
		return m, nil // a first hop: nothing more to read
	}
	d := headerDecoder{hs: r.Headers}
	d.origin(&m)
	d.failures(&m)
	d.routing(&m)
	d.decode(&m)
	d.owner(&m)
	d.deliveryCount(&m)
	return m, errors.Join(d.errs...)
}

// hasKscopeHeader reports whether a header of hs is named like kscope's
// (kscopePrefix): every header FromRecord reads is, so a record with
// none (a first hop, with the producer's own headers) is read no further.
func hasKscopeHeader(hs []kgo.RecordHeader) bool {
	for i := range hs {
		if strings.HasPrefix(hs[i].Key, kscopePrefix) {
			return true
		}
	}
	return false
}

// kscopePrefix starts the name of every header kscope writes.
const kscopePrefix = "kscope-"

// headerDecoder reads a record's kscope headers into Metadata, field by
// field, and collects an error for each malformed one.
type headerDecoder struct {
	hs   []kgo.RecordHeader
	errs []error
}

// header returns the value of the last header named k.
func (d *headerDecoder) header(k string) ([]byte, bool) { return lastHeader(d.hs, k) }

// bad records that header h has the malformed value v.
func (d *headerDecoder) bad(h string, v []byte) {
	d.errs = append(d.errs, fmt.Errorf("retrytopic: header %s has a malformed value %q", h, truncateBytes(v, 40)))
}

// origin reads where the record was first consumed: its original topic,
// partition and offset (together, or not at all), timestamp and key.
func (d *headerDecoder) origin(m *Metadata) {
	if t, ok := d.header(HeaderOriginalTopic); ok && len(t) > 0 {
		p, pok := d.header(HeaderOriginalPartition)
		o, ook := d.header(HeaderOriginalOffset)
		pv, perr := strconv.ParseInt(string(p), 10, 32)
		ov, oerr := strconv.ParseInt(string(o), 10, 64)
		if pok && ook && perr == nil && oerr == nil && pv >= 0 && ov >= 0 && utf8.Valid(t) {
			m.OriginalTopic, m.OriginalPartition, m.OriginalOffset = string(t), int32(pv), ov
		} else {
			d.bad(HeaderOriginalTopic, t)
		}
	}
	if v, ok := d.header(HeaderOriginalTimestamp); ok {
		if t, ok := parseMillis(v); ok {
			m.OriginalTimestamp = t
		} else {
			d.bad(HeaderOriginalTimestamp, v)
		}
	}
	if v, ok := d.header(HeaderOriginalKey); ok {
		m.OriginalKey = clip(v, MaxKeyLength)
	}
}

// failures reads the record's failures: the group, the attempt count, the
// first and last failure times, the due time, and the latest error and
// its class.
func (d *headerDecoder) failures(m *Metadata) {
	if v, ok := d.header(HeaderGroup); ok {
		m.Group = truncate(string(v), 255)
	}
	if v, ok := d.header(HeaderAttempt); ok {
		n, err := strconv.Atoi(string(v))
		switch {
		case err != nil && len(v) > 0 && allDigits(v):
			m.Attempt = MaxAttempt // too large to parse: forged
		case err != nil || n < 0:
			d.bad(HeaderAttempt, v)
		default:
			m.Attempt = min(n, MaxAttempt)
		}
	}
	d.time(HeaderFirstFailure, &m.FirstFailure)
	d.time(HeaderLastFailure, &m.LastFailure)
	d.time(HeaderDue, &m.Due)
	if v, ok := d.header(HeaderError); ok {
		m.Error = truncate(string(v), MaxErrorLength)
	}
	if v, ok := d.header(HeaderErrorClass); ok {
		if c, ok := ParseClass(string(v)); ok {
			m.Class = c
		} else {
			d.bad(HeaderErrorClass, v)
		}
	}
}

// routing reads where the record was routed: its retry-topic stage,
// whether it is parked, and the version gap it was routed for.
func (d *headerDecoder) routing(m *Metadata) {
	if v, ok := d.header(HeaderStage); ok {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 0 || n > maxStage {
			d.bad(HeaderStage, v)
		} else {
			m.Stage = n
		}
	}
	if v, ok := d.header(HeaderParked); ok {
		m.Parked = string(v) == "1"
	}
	d.version(HeaderVersionExpected, &m.ExpectedVersion)
	d.version(HeaderVersionActual, &m.ActualVersion)
}

// time reads header h, a time in Unix milliseconds, into t. Fields are
// read one call each rather than from a table of their addresses, which
// would move the whole Metadata to the heap for every record.
func (d *headerDecoder) time(h string, t *time.Time) {
	if v, ok := d.header(h); ok {
		if tv, ok := parseMillis(v); ok {
			*t = tv
		} else {
			d.bad(h, v)
		}
	}
}

// version reads header h, a version (a non-negative integer), into n.
func (d *headerDecoder) version(h string, n *int64) {
	if v, ok := d.header(h); ok {
		nv, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || nv < 0 {
			d.bad(h, v)
		} else {
			*n = nv
		}
	}
}

// Headers returns the record headers for m: every header of orig that is not
// kscope's (nor Spring's DLT headers, when spring is set) is kept, in order,
// then m's headers are appended.
func (m Metadata) Headers(orig []kgo.RecordHeader, spring bool) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, 0, len(orig)+20)
	for _, h := range orig {
		if strings.HasPrefix(h.Key, kscopePrefix) || (spring && strings.HasPrefix(h.Key, "kafka_dlt-")) {
			continue
		}
		out = append(out, h)
	}
	add := func(k, v string) { out = append(out, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	add(HeaderID, m.ID)
	add(HeaderOriginalTopic, m.OriginalTopic)
	add(HeaderOriginalPartition, strconv.FormatInt(int64(m.OriginalPartition), 10))
	add(HeaderOriginalOffset, strconv.FormatInt(m.OriginalOffset, 10))
	add(HeaderOriginalTimestamp, millis(m.OriginalTimestamp))
	if m.OriginalKey != nil {
		out = append(out, kgo.RecordHeader{Key: HeaderOriginalKey, Value: truncateBytes(m.OriginalKey, MaxKeyLength)})
	}
	add(HeaderGroup, m.Group)
	if m.Owner != "" {
		add(HeaderOwner, truncate(m.Owner, MaxOwnerLength))
	}
	add(HeaderAttempt, strconv.Itoa(m.Attempt))
	if m.DeliveryCount > 0 {
		add(HeaderDeliveryCount, strconv.Itoa(int(m.DeliveryCount)))
	}
	if !m.FirstFailure.IsZero() {
		add(HeaderFirstFailure, millis(m.FirstFailure))
	}
	if !m.LastFailure.IsZero() {
		add(HeaderLastFailure, millis(m.LastFailure))
	}
	if m.Error != "" || m.Attempt > 0 {
		add(HeaderError, truncate(m.Error, MaxErrorLength))
		add(HeaderErrorClass, m.Class.String())
	}
	if !m.Due.IsZero() {
		add(HeaderDue, millis(m.Due))
	}
	if m.Stage >= 0 {
		add(HeaderStage, strconv.Itoa(m.Stage))
	}
	if m.Parked {
		add(HeaderParked, "1")
	}
	if m.ExpectedVersion > 0 || m.ActualVersion > 0 {
		add(HeaderVersionExpected, strconv.FormatInt(m.ExpectedVersion, 10))
		add(HeaderVersionActual, strconv.FormatInt(m.ActualVersion, 10))
	}
	out = m.appendDecode(out)
	if spring {
		add(SpringOriginalTopic, m.OriginalTopic)
		out = append(out,
			kgo.RecordHeader{Key: SpringOriginalPartition, Value: binary.BigEndian.AppendUint32(nil, uint32(m.OriginalPartition))},
			kgo.RecordHeader{Key: SpringOriginalOffset, Value: binary.BigEndian.AppendUint64(nil, uint64(m.OriginalOffset))},
			kgo.RecordHeader{Key: SpringOriginalTimestamp, Value: binary.BigEndian.AppendUint64(nil, uint64(m.OriginalTimestamp.UnixMilli()))},
		)
		add(SpringOriginalGroup, m.Group)
		add(SpringExceptionMessage, truncate(m.Error, MaxErrorLength))
		add(SpringExceptionFQCN, "kscope."+m.Class.String())
	}
	return out
}

func millis(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

func parseMillis(v []byte) (time.Time, bool) {
	n, err := strconv.ParseInt(string(v), 10, 64)
	// Between 1970 and the year 9999: anything else is corrupt.
	if err != nil || n < 0 || n > 253402300799999 {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// truncate cuts s to at most n bytes on a rune boundary and replaces invalid
// UTF-8, so a header value is always valid text.
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	const ell = "…"
	cut := n - len(ell)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ell
}

// clip returns at most the first n bytes of b, sharing b's memory, with
// no room to append into it.
func clip(b []byte, n int) []byte {
	n = min(len(b), n)
	return b[:n:n]
}

func truncateBytes(b []byte, n int) []byte {
	if b == nil {
		return nil
	}
	if len(b) > n {
		b = b[:n]
	}
	return append([]byte{}, b...)
}

func lastHeader(hs []kgo.RecordHeader, key string) ([]byte, bool) {
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == key {
			return hs[i].Value, true
		}
	}
	return nil, false
}

// Header names of a version gap, on records routed because of one.
const (
	HeaderVersionExpected = "kscope-version-expected" // the version that was due
	HeaderVersionActual   = "kscope-version-actual"   // the version the record carries
)

// VersionGapError says a record's version is ahead of the next one due for
// its key. Routing copies it into the version headers.
type VersionGapError struct {
	Expected, Actual int64
}

// Error describes the gap.
func (e *VersionGapError) Error() string {
	return fmt.Sprintf("version gap: expected version %d, got %d", e.Expected, e.Actual)
}
