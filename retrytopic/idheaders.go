package retrytopic

// Header names kscope writes and reads to keep a record's identity and
// origin stable across hops (retry topics, the dead-letter topic, redrive).
const (
	// HeaderID carries a record's identity (its dedupe key) once kscope has
	// computed it; every hop keeps it, so a record that succeeds on its
	// third attempt is still deduplicated against its first.
	HeaderID = "kscope-id"
	// HeaderOriginalTopic, HeaderOriginalPartition, HeaderOriginalOffset
	// and HeaderOriginalTimestamp carry the coordinates of the record as
	// first consumed (decimal partition and offset; timestamp in Unix
	// milliseconds).
	HeaderOriginalTopic     = "kscope-original-topic"
	HeaderOriginalPartition = "kscope-original-partition"
	HeaderOriginalOffset    = "kscope-original-offset"
	HeaderOriginalTimestamp = "kscope-original-timestamp"

	// DefaultMessageIDHeader is the producer-set header read as a record's
	// identity when no other is configured.
	DefaultMessageIDHeader = "message-id"

	// MaxIDLength bounds an identity. A longer one (from a header or an
	// extractor) is replaced by "sha256:" and the hex digest of it, so that a
	// hostile producer cannot blow up the inbox key.
	MaxIDLength = 200
)
