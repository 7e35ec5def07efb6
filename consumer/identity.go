package consumer

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"unicode/utf8"

	"github.com/kscope-dev/kscope/retrytopic"
)

// Header names kscope writes and reads to keep a record's identity and
// origin stable across hops; they are defined in retrytopic.
const (
	HeaderID                = retrytopic.HeaderID
	HeaderOriginalTopic     = retrytopic.HeaderOriginalTopic
	HeaderOriginalPartition = retrytopic.HeaderOriginalPartition
	HeaderOriginalOffset    = retrytopic.HeaderOriginalOffset
	HeaderOriginalTimestamp = retrytopic.HeaderOriginalTimestamp
	HeaderDue               = retrytopic.HeaderDue
	DefaultMessageIDHeader  = retrytopic.DefaultMessageIDHeader
	MaxIDLength             = retrytopic.MaxIDLength
)

// Identity computes a record's identity, its dedupe key.
//
// Keep it the same from one deployment to the next, as the inbox's key: a
// record a new Header or Extract names differently is not recognised as
// one the inbox already holds. Records in the retry topics keep the
// identity stamped on their first hop; those a rolling deploy redelivers
// (applied, their offsets not yet committed) would be handled again,
// unless dbscope.Options.StoreOffsets skips them by offset.
type Identity struct {
	// Header is the producer-set header that carries the identity. Default
	// DefaultMessageIDHeader.
	Header string
	// Extract, when not nil, derives the identity from the record (from its
	// payload, say) for records without the header. It returns false when
	// it cannot.
	Extract func(*Record) (string, bool)
}

// Of returns r's identity, in this order: the identity kscope stamped on an
// earlier hop (HeaderID); the producer's header; the extractor; the original
// coordinates carried in headers; the record's own "topic/partition/offset".
func (i Identity) Of(r *Record) string {
	// One allocation, the string's: the identity is appended to a buffer
	// on the stack (this runs for every record).
	var a [128]byte
	return string(i.Append(a[:0], r))
}

// Append appends r's identity (the bytes of Of's result) to dst and
// returns the extended slice: a caller that only reads the identity, to
// hash it or compare it, gives a buffer of its own and allocates nothing
// when the buffer is large enough.
func (i Identity) Append(dst []byte, r *Record) []byte {
	if v, ok := r.Header(HeaderID); ok && len(v) > 0 {
		return appendBounded(dst, v)
	}
	h := i.Header
	if h == "" {
		h = DefaultMessageIDHeader
	}
	if v, ok := r.Header(h); ok && len(v) > 0 {
		return appendBounded(dst, v)
	}
	if i.Extract != nil {
		if v, ok := i.Extract(r); ok && v != "" {
			return append(dst, bound(v)...)
		}
	}
	if t, ok := r.Header(HeaderOriginalTopic); ok {
		p, pok := r.Header(HeaderOriginalPartition)
		o, ook := r.Header(HeaderOriginalOffset)
		if pok && ook && isDecimal(p) && isDecimal(o) {
			start := len(dst)
			dst = append(append(append(append(append(dst, t...), '/'), p...), '/'), o...)
			if id := dst[start:]; len(id) > MaxIDLength || !utf8.Valid(id) {
				return append(dst[:start], bound(string(id))...)
			}
			return dst
		}
	}
	dst = append(dst, r.Topic...)
	dst = append(dst, '/')
	dst = strconv.AppendInt(dst, int64(r.Partition), 10)
	dst = append(dst, '/')
	return strconv.AppendInt(dst, r.Offset, 10)
}

// appendBounded appends v to dst as bound would return it.
func appendBounded(dst, v []byte) []byte {
	if len(v) <= MaxIDLength && utf8.Valid(v) {
		return append(dst, v...)
	}
	sum := sha256.Sum256(v)
	dst = append(dst, "sha256:"...)
	return hex.AppendEncode(dst, sum[:])
}

func bound(s string) string {
	if len(s) <= MaxIDLength && utf8.ValidString(s) {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func isDecimal(b []byte) bool {
	if len(b) == 0 || len(b) > 19 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
