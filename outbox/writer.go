package outbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/hook"
)

// Defaults applied to Writer and Options fields left at their zero value.
const (
	DefaultOutbox     = "default"
	DefaultPartitions = 16
	// DefaultMaxRecordBytes is Writer.MaxRecordBytes's default: just
	// below the 1,000,012 bytes of a record batch that franz-go's
	// ProducerBatchMaxBytes and the broker's max.message.bytes allow by
	// default.
	DefaultMaxRecordBytes = 1_000_000
)

// Writer adds records to an outbox. The zero value writes to the default
// outbox ("default", 16 partitions, kscope's default table prefix); a
// service with a Relay of other Options uses a Writer with the same
// Outbox, Partitions and TablePrefix.
type Writer struct {
	// Outbox names the outbox: a Relay publishes one outbox. Default
	// "default". At most 100 of a-z A-Z 0-9 . _ - (ValidOutboxName): the
	// name is part of every record's identity ("<outbox>/<partition>/<seq>")
	// and of the wake-up a new row sends its relay.
	Outbox string
	// Partitions splits the outbox by key hash: the records of one key are
	// in one partition, published in the order their transactions
	// committed, and relay instances share the partitions. It must be the
	// Relay's and must not change while rows are unpublished: rows in a
	// partition the relay does not have are never published (the relay
	// reports them, Stats.Stranded), and with fewer partitions a key's
	// rows may be published out of order. Default 16.
	Partitions int
	// TablePrefix is the prefix dbscope.Migrate was given. Default
	// dbscope.DefaultTablePrefix.
	TablePrefix string
	// Hooks are consulted on Add: each hook.InjectHook among them
	// (kscopeotel's tracer, say) writes into the record's headers what it
	// carries of Add's context, such as the trace of the request or of the
	// DB-scope delivery that wrote the row. The published record carries
	// it on, so the consumer downstream continues that trace. Pass the
	// hooks of the service's consumer Config.
	Hooks []hook.Hook
	// MaxRecordBytes bounds a record's key, value and headers together
	// (after Hooks added theirs): Add and Queue refuse a larger record
	// with an error, in the writer's transaction, rather than leave the
	// relay a row Kafka would refuse. Default DefaultMaxRecordBytes
	// (1,000,000), for the relay's producer and brokers at their default
	// limits; a relay given a larger kgo.ProducerBatchMaxBytes, to topics
	// with a larger max.message.bytes, wants a Writer with a larger bound.
	// Negative: no bound. Kafka's framing and the kscope-id header add
	// about a hundred bytes to a record, so a row just within the bound
	// may still be too large for the relay: the relay moves a row Kafka
	// refuses for good to the dead-letter table (see Relay).
	MaxRecordBytes int
}

func (w Writer) withDefaults() Writer {
	if w.Outbox == "" {
		w.Outbox = DefaultOutbox
	}
	if w.Partitions == 0 {
		w.Partitions = DefaultPartitions
	}
	if w.TablePrefix == "" {
		w.TablePrefix = dbscope.DefaultTablePrefix
	}
	if w.MaxRecordBytes == 0 {
		w.MaxRecordBytes = DefaultMaxRecordBytes
	}
	return w
}

// outboxNameRE is what an outbox name may be: it is part of the records'
// identities and of the relay's wake-ups, both split at '/'.
var outboxNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

// ValidOutboxName reports, with an error that says what to change, an
// outbox name that a Writer and a Relay refuse.
func ValidOutboxName(name string) error {
	if !outboxNameRE.MatchString(name) {
		return fmt.Errorf("kscope: outbox name %q is not allowed; use 1 to 100 of a-z A-Z 0-9 . _ - (it is part of each record's identity, <outbox>/<partition>/<seq>)", name)
	}
	return nil
}

func (w Writer) validate() error {
	var errs []error
	if err := ValidOutboxName(w.Outbox); err != nil {
		errs = append(errs, err)
	}
	if w.Partitions < 1 || w.Partitions > 4096 {
		errs = append(errs, fmt.Errorf("kscope: outbox.Writer.Partitions is %d; set it between 1 and 4096 (0 selects %d), the same as the Relay's", w.Partitions, DefaultPartitions))
	}
	if err := dbscope.ValidTablePrefix(w.TablePrefix); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Querier is what Add needs of a transaction: a pgx.Tx, or the pgx.Tx a
// DB-scope Handler receives.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Add adds rec (its Topic, Key, Value and Headers; Partition and Timestamp
// are left to the producer) to the outbox inside tx: the relay publishes it
// if and only if tx commits, exactly once to a read_committed reader. It
// returns the record's identity, which the published record carries in the
// kscope-id header: a kscope consumer downstream deduplicates on it, and it
// is a stable idempotency key for whatever the record asks done. A record
// the relay could not publish (larger than MaxRecordBytes, or to a topic
// name Kafka does not allow) is refused with an error, and nothing is
// written.
//
// The record's outbox partition stays locked from Add until tx ends, so
// that records of a partition are published in the order their
// transactions committed: another transaction adding to the same partition
// waits for tx. Add the outbox records last in a transaction that holds
// locks of its own for long.
func (w Writer) Add(ctx context.Context, tx Querier, rec *kgo.Record) (string, error) {
	w = w.withDefaults()
	if err := w.validate(); err != nil {
		return "", err
	}
	if rec == nil || rec.Topic == "" {
		return "", errors.New("kscope: outbox.Add: the record has no Topic; set the topic it is to be published to")
	}
	for _, h := range w.Hooks {
		if in, ok := h.(hook.InjectHook); ok {
			in.InjectRecord(ctx, rec)
		}
	}
	if err := w.check(rec); err != nil {
		return "", fmt.Errorf("kscope: outbox.Add: %w", err)
	}
	var id string
	err := tx.QueryRow(ctx, w.insertSQL(), w.args(rec)...).Scan(&id)
	if err != nil {
		return "", fmt.Errorf("kscope: outbox.Add: %w", err)
	}
	return id, nil
}

// Queue queues the insert of rec into the outbox on q, for a
// dbscope.QueueHandler: it runs, with the record's other statements, in
// the transaction that holds the record's inbox row, and the relay
// publishes rec if and only if that transaction commits. It refuses what
// Add refuses, queueing nothing.
func (w Writer) Queue(q *dbscope.Queue, rec *kgo.Record) error {
	w = w.withDefaults()
	if err := w.validate(); err != nil {
		return err
	}
	if rec == nil || rec.Topic == "" {
		return errors.New("kscope: outbox.Writer.Queue: the record has no Topic; set the topic it is to be published to")
	}
	if err := w.check(rec); err != nil {
		return fmt.Errorf("kscope: outbox.Writer.Queue: %w", err)
	}
	q.Exec(w.insertSQL(), w.args(rec)...)
	return nil
}

// check refuses a record the relay could not publish: to a topic name
// Kafka does not allow, or larger than MaxRecordBytes.
func (w Writer) check(rec *kgo.Record) error {
	if !ValidTopic(rec.Topic) {
		return fmt.Errorf("the record's topic %q is not a Kafka topic name; use at most 249 of a-z A-Z 0-9 . _ -", rec.Topic)
	}
	if n := recordBytes(rec); w.MaxRecordBytes > 0 && n > w.MaxRecordBytes {
		return fmt.Errorf("the record's key, value and headers are %d bytes, more than MaxRecordBytes (%d): Kafka would refuse it; "+
			"make it smaller (a reference to the payload rather than the payload), or raise MaxRecordBytes with the relay's kgo.ProducerBatchMaxBytes and the topic's max.message.bytes",
			n, w.MaxRecordBytes)
	}
	return nil
}

// ValidTopic reports whether Kafka allows t as a topic name: at most 249
// of a-z A-Z 0-9 . _ -, and neither "." nor "..". Writer refuses a record
// to any other, and the relay dead-letters a row to one.
func ValidTopic(t string) bool {
	const chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
	return t != "" && len(t) <= 249 && t != "." && t != ".." && strings.Trim(t, chars) == ""
}

// recordBytes is the size of rec's key, value and headers, as franz-go
// counts a record against its limits.
func recordBytes(rec *kgo.Record) int {
	n := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// Add adds rec to the default outbox inside tx; see Writer.Add.
func Add(ctx context.Context, tx Querier, rec *kgo.Record) (string, error) {
	return Writer{}.Add(ctx, tx, rec)
}

// insertSQL takes the partition's next sequence number (locking its row
// until the transaction ends) and inserts the record with it, in one
// statement.
func (w Writer) insertSQL() string {
	p := w.TablePrefix
	return `WITH s AS (
		INSERT INTO ` + p + `outbox_sequences AS s (outbox, partition, next_seq) VALUES ($1, $2, 2)
		ON CONFLICT (outbox, partition) DO UPDATE SET next_seq = s.next_seq + 1
		RETURNING next_seq - 1 AS seq)
	INSERT INTO ` + p + `outbox (outbox, partition, seq, topic, key, value, headers)
	SELECT $1, $2, s.seq, $3, $4, $5, $6 FROM s
	RETURNING $1 || '/' || $2::text || '/' || seq::text`
}

func (w Writer) args(rec *kgo.Record) []any {
	return []any{w.Outbox, int32(partitionOf(rec.Key, w.Partitions)), rec.Topic, rec.Key, rec.Value, encodeHeaders(rec.Headers)}
}

// partitionOf is the outbox partition of key: FNV-1a of the key modulo n
// (a null key goes to partition 0).
func partitionOf(key []byte, n int) int {
	if key == nil {
		return 0
	}
	h := fnv.New32a()
	h.Write(key)
	return int(h.Sum32() % uint32(n))
}

// encodeHeaders encodes headers as a count followed by length-prefixed
// keys and values.
func encodeHeaders(hs []kgo.RecordHeader) []byte {
	if len(hs) == 0 {
		return nil
	}
	b := binary.AppendUvarint(nil, uint64(len(hs)))
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		b = binary.AppendUvarint(b, uint64(len(h.Value)))
		b = append(b, h.Value...)
	}
	return b
}

// decodeHeaders is the inverse of encodeHeaders.
func decodeHeaders(b []byte) ([]kgo.RecordHeader, error) {
	if len(b) == 0 {
		return nil, nil
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, errors.New("outbox: corrupt headers")
	}
	b = b[k:]
	out := make([]kgo.RecordHeader, 0, n)
	next := func() ([]byte, error) {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return nil, errors.New("outbox: corrupt headers")
		}
		v := b[k : k+int(l)]
		b = b[k+int(l):]
		return v, nil
	}
	for range n {
		key, err := next()
		if err != nil {
			return nil, err
		}
		val, err := next()
		if err != nil {
			return nil, err
		}
		out = append(out, kgo.RecordHeader{Key: string(key), Value: append([]byte(nil), val...)})
	}
	return out, nil
}
