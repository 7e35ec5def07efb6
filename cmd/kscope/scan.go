package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/kread"
	"github.com/kscope-dev/kscope/retrytopic"
)

// defaultIdleTimeout is how long a read waits for the next record of a
// partition that has not reached its end offset yet.
const defaultIdleTimeout = 30 * time.Second

// dltFlags are the flags that name a dead-letter topic and select records
// in it, shared by dlt list, show and redrive.
type dltFlags struct {
	brokers     *string
	topic       *string
	group       *string
	partition   *int
	fromOffset  *int64
	toOffset    *int64
	key         *string
	class       *string
	id          *string
	idleTimeout *time.Duration
	timeouts    *timeouts
	fs          *flag.FlagSet
}

func declareDLTFlags(fs *flag.FlagSet, selection bool) *dltFlags {
	f := &dltFlags{fs: fs}
	f.brokers = brokerFlag(fs)
	f.topic = fs.String("topic", "", "the dead-letter topic to read")
	f.group = fs.String("group", "", "the consumer group whose dead-letter topic (<group>.kscope-dlt) to read, when --topic is not given")
	f.partition = fs.Int("partition", -1, "only this partition (-1: all)")
	f.idleTimeout = fs.Duration("idle-timeout", defaultIdleTimeout, "give up when a partition yields no record for this long before reaching its end offset")
	f.timeouts = timeoutFlags(fs)
	if selection {
		f.fromOffset = fs.Int64("from-offset", -1, "only records at or after this offset (-1: from the start)")
		f.toOffset = fs.Int64("to-offset", -1, "only records at or before this offset, inclusive (-1: up to the end)")
		f.key = fs.String("key", "", "only records with exactly this key (as text)")
		f.class = fs.String("class", "", "only records whose error class is this: unknown, retryable, terminal or skip")
		f.id = fs.String("id", "", "only records with this kscope identity (the kscope-id header, or the identity derived as the consumer does by default)")
	}
	return f
}

// dltTopic returns the topic named by --topic or --group.
func (f *dltFlags) dltTopic() (string, error) {
	switch {
	case *f.topic != "":
		return *f.topic, nil
	case *f.group != "":
		return retrytopic.DLTopic(*f.group), nil
	}
	return "", usagef("give the dead-letter topic with --topic, or the consumer group with --group (the topic is then <group>.kscope-dlt)")
}

func (f *dltFlags) isSet(name string) bool {
	set := false
	f.fs.Visit(func(fl *flag.Flag) {
		if fl.Name == name {
			set = true
		}
	})
	return set
}

// selection returns the scan bounds and the record filter from the flags.
func (f *dltFlags) selection() (scanRange, *recordFilter, error) {
	r := scanRange{partition: int32(*f.partition), from: -1, to: -1, idle: *f.idleTimeout}
	if *f.partition < -1 || *f.partition > 1<<31-1 {
		return r, nil, usagef("--partition %d is not a partition number", *f.partition)
	}
	if r.idle <= 0 {
		return r, nil, usagef("--idle-timeout must be positive, got %v", r.idle)
	}
	flt := &recordFilter{}
	if f.fromOffset != nil {
		r.from, r.to = *f.fromOffset, *f.toOffset
		if r.from < -1 || r.to < -1 {
			return r, nil, usagef("offsets are 0 or more (-1 for no bound), got --from-offset %d --to-offset %d", r.from, r.to)
		}
		if r.to >= 0 && r.from > r.to {
			return r, nil, usagef("--from-offset %d is after --to-offset %d", r.from, r.to)
		}
	}
	if f.key == nil { // no content filters on this command
		return r, flt, nil
	}
	if f.isSet("key") {
		k := *f.key
		flt.key = &k
	}
	if *f.class != "" {
		c, ok := retrytopic.ParseClass(*f.class)
		if !ok {
			return r, nil, usagef("unknown --class %q: use unknown, retryable, terminal or skip", *f.class)
		}
		flt.class = &c
	}
	flt.id = *f.id
	return r, flt, nil
}

// recordFilter selects DLT records by their content.
type recordFilter struct {
	key   *string
	class *retrytopic.Class
	id    string
}

func (f *recordFilter) match(r *kgo.Record, m retrytopic.Metadata) bool {
	if f.key != nil && string(r.Key) != *f.key {
		return false
	}
	if f.class != nil && m.Class != *f.class {
		return false
	}
	if f.id != "" && m.ID != f.id {
		return false
	}
	return true
}

// decode returns the kscope metadata r carries, with r's identity as a
// consumer with the default identity computes it, and a note on malformed
// headers.
func decode(r *kgo.Record) (retrytopic.Metadata, error) {
	return retrytopic.FromRecord(r, consumer.Identity{}.Of(&consumer.Record{Record: r}))
}

// scanRange bounds a read of a topic.
type scanRange struct {
	partition int32 // -1: all partitions
	from, to  int64 // inclusive offset bounds, -1: none
	idle      time.Duration
}

// partitionBounds is what a scan reads of one partition: [begin, end).
// heldTo, when above end, is where the range would end but for a
// transaction still open when the read began: a read-committed reader
// cannot read past its first offset (end) until it ends.
type partitionBounds struct {
	begin, end int64
	heldTo     int64
}

// heldBack names the records of a partition that a transaction still open
// kept a read from: offsets from up to to, exclusive.
type heldBack struct {
	partition int32
	from, to  int64
}

func (h heldBack) String() string {
	return fmt.Sprintf("partition %d: a transaction open since offset %d holds back offsets %d to %d, not read: a read-committed reader cannot pass it until it ends (its producer's transaction timeout aborts it at the latest)",
		h.partition, h.from, h.from, h.to-1)
}

// deletedError says that records of a partition were deleted (retention,
// or DeleteRecords) after the read began and before it reached them.
type deletedError struct {
	topic     string
	partition int32
	from      int64 // the first offset not read
	start     int64 // the partition's start offset now
}

func (e *deletedError) Error() string {
	return fmt.Sprintf("records of %s partition %d from offset %d to %d were deleted (retention) before they were read; the partition now starts at %d",
		e.topic, e.partition, e.from, e.start-1, e.start)
}

// topicExists checks that topic exists and returns its partition count.
func topicExists(ctx context.Context, adm *kadm.Client, kc *kafkaConn, topic, what string) (int, error) {
	var tds kadm.TopicDetails
	err := kc.do(ctx, func(ctx context.Context) (err error) { tds, err = adm.ListTopics(ctx, topic); return err })
	if err != nil && !isTimeout(err) { // a timeout is explained already
		err = kc.reachErr(err)
	}
	if err != nil {
		return 0, err
	}
	td, ok := tds[topic]
	if !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
		return 0, fmt.Errorf("topic %q does not exist: %s", topic, what)
	}
	if td.Err != nil {
		return 0, fmt.Errorf("cannot read the metadata of topic %q: %w", topic, td.Err)
	}
	return len(td.Partitions), nil
}

// bounds returns, per partition to read, the offsets from the range's start
// (or the log start) up to the range's end (or the last stable offset seen
// now: a read never waits for records produced after it began).
func bounds(ctx context.Context, adm *kadm.Client, kc *kafkaConn, topic string, r scanRange) (map[int32]partitionBounds, error) {
	n, err := topicExists(ctx, adm, kc, topic, "check --topic or --group (a group's dead-letter topic is <group>.kscope-dlt and is created with the group's retry topics)")
	if err != nil {
		return nil, err
	}
	if r.partition >= 0 && int(r.partition) >= n {
		return nil, usagef("topic %q has no partition %d: it has %d partitions (0 to %d)", topic, r.partition, n, n-1)
	}
	var out map[int32]partitionBounds
	err = kc.do(ctx, func(ctx context.Context) (err error) { out, err = listBounds(ctx, adm, topic, r); return err })
	return out, err
}

// listBounds lists the offsets that bound a read of topic.
func listBounds(ctx context.Context, adm *kadm.Client, topic string, r scanRange) (map[int32]partitionBounds, error) {
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing the start offsets of %q: %w", topic, err)
	}
	// Read committed: the end a reader can reach is the last stable offset.
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing the end offsets of %q: %w", topic, err)
	}
	// The high watermark, past the last stable offset while a transaction
	// is open: the records between are held back.
	marks, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = marks.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing the end offsets of %q: %w", topic, err)
	}
	out := make(map[int32]partitionBounds)
	for p, s := range starts[topic] {
		if r.partition >= 0 && p != r.partition {
			continue
		}
		e, ok := ends.Lookup(topic, p)
		if !ok {
			continue
		}
		b := partitionBounds{begin: s.Offset, end: e.Offset}
		if m, ok := marks.Lookup(topic, p); ok && m.Offset > b.end {
			b.heldTo = m.Offset
		}
		if r.from > b.begin {
			b.begin = r.from
		}
		if r.to >= 0 && r.to+1 < b.end {
			b.end = r.to + 1
		}
		if r.to >= 0 && r.to+1 < b.heldTo {
			b.heldTo = r.to + 1
		}
		out[p] = b
	}
	return out, nil
}

// scan reads topic partition by partition, in offset order, from each
// partition's begin up to its end offset as listed when the scan started,
// with read-committed isolation, and calls fn for each data record. It
// uses no consumer group and commits nothing. It returns the records a
// transaction still open when it began held back, and a *deletedError
// when records of the range were deleted before it reached them.
func scan(ctx context.Context, kc *kafkaConn, adm *kadm.Client, topic string, r scanRange, fn func(*kgo.Record) error) ([]heldBack, error) {
	bs, err := bounds(ctx, adm, kc, topic, r)
	if err != nil {
		return nil, err
	}
	cl, err := kc.client(
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers are kept so that a partition whose last
		// offsets are a marker is seen to reach its end.
		kgo.KeepControlRecords(),
		// An offset below the log start fails the read instead of
		// resuming at the start: the records in between were deleted
		// since the bounds were listed, and are named, not passed over.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
	)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var held []heldBack
	for _, p := range sortedPartitions(bs) {
		b := bs[p]
		if b.heldTo > max(b.end, b.begin) {
			held = append(held, heldBack{partition: p, from: max(b.end, b.begin), to: b.heldTo})
		}
		if b.begin >= b.end {
			continue
		}
		if err := scanPartition(ctx, cl, adm, topic, p, b, r.idle, fn); err != nil {
			return held, err
		}
	}
	return held, nil
}

func scanPartition(ctx context.Context, cl *kgo.Client, adm *kadm.Client, topic string, p int32, b partitionBounds, idle time.Duration, fn func(*kgo.Record) error) error {
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: {p: kgo.NewOffset().At(b.begin)}})
	defer cl.RemoveConsumePartitions(map[string][]int32{topic: {p}})
	next := b.begin // the first offset not read yet
	err := kread.ToEnd(ctx, cl, map[string]map[int32]int64{topic: {p: b.end}}, kread.Options{
		Idle: idle,
		// The broker lost records the client had read (an unclean leader
		// election): the client resumes where the log diverged.
		Tolerate: func(err error) bool { return errors.As(err, new(*kgo.ErrDataLoss)) },
	}, func(rec *kgo.Record) error {
		if rec.Offset < b.begin {
			return nil
		}
		next = rec.Offset + 1
		return fn(rec)
	})
	var idleErr *kread.IdleError
	switch {
	case errors.As(err, &idleErr):
		return fmt.Errorf("reading %s partition %d: no record for %v at offset %d, before the end offset %d seen at start; "+
			"records may have been deleted (retention) or the cluster is slow: re-run, raise --idle-timeout, or narrow the read with --from-offset/--to-offset",
			topic, p, idle, max(idleErr.Offset, b.begin), b.end)
	case errors.Is(err, kerr.OffsetOutOfRange):
		starts, lerr := adm.ListStartOffsets(ctx, topic)
		if lerr == nil {
			lerr = starts.Error()
		}
		if s, ok := starts.Lookup(topic, p); lerr == nil && ok && s.Offset > next {
			return &deletedError{topic: topic, partition: p, from: next, start: s.Offset}
		}
	}
	return err
}

// warnDecode writes a note about malformed kscope headers of r.
func warnDecode(w io.Writer, r *kgo.Record, err error) {
	if err != nil {
		fmt.Fprintf(w, "warning: partition %d offset %d: %v\n", r.Partition, r.Offset, err)
	}
}
