package txn

import (
	"context"
	"sync"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
)

// Defaults of DedupeOptions.
const (
	DefaultDedupeWindow = 24 * time.Hour // DedupeOptions.Window
	DefaultDedupeMaxIDs = 100_000        // DedupeOptions.MaxIDs
)

// DedupeOptions turn on the Kafka scope's idempotency guard
// (Options.Dedupe): the identity (consumer.Config.Identity) of each input
// whose handler succeeded is remembered in the scope's state, written to
// the version changelog ([VersionsTopic]) in the same Kafka transaction as
// the input's outputs and offset, and restored with it when a partition is
// assigned. An input whose identity is remembered (an upstream duplicate:
// a producer's retry, a relay that sends again, a replay) produces no
// output: it is committed and counted as a duplicate (KafkaStats.Duplicates,
// hook outcome duplicate). No crash window remains: the remembering and the
// outputs commit or abort together.
//
// The window is bounded by time (Window) and by count (MaxIDs per input
// partition): the identities a transaction remembered in a partition are
// one changelog record, a segment, and are forgotten together, oldest
// segment first, by a tombstone written in a later transaction. A
// duplicate that comes after its original was forgotten is handled again.
// The guard keeps 16 bytes of each identity (the start of its SHA-256):
// 55 to 95 bytes of the member's memory (its segment's copy and a slot of
// its partition's table, which grows by doubling) and 16 bytes of the
// changelog per remembered identity; each transaction adds one record per
// partition it remembered in. A partition that remembers fast has that
// memory made at once for what it will hold a minute on at its rate (at
// most MaxIDs, and no more than Window holds), a restored one for what it
// restored; a quiet partition's grows as it fills. A duplicate must carry
// the identity of its original (the producer's message-id header: records
// identified by their coordinates are never duplicates of one another) and
// its key (so it lands in the same partition). An input that succeeds on
// a retry topic's hop (Unordered) is not remembered.
type DedupeOptions struct {
	// Window is how long an identity is remembered. Default
	// DefaultDedupeWindow.
	Window time.Duration
	// MaxIDs bounds the identities remembered per input partition, at
	// most 2^30. Default DefaultDedupeMaxIDs.
	MaxIDs int
}

// maxDedupeIDs bounds DedupeOptions.MaxIDs: a partition's segment
// numbers then span less than 2^31, which the guard's table relies on
// (idTable).
const maxDedupeIDs = 1 << 30

// Changelog record key 'd' + 8-byte big-endian sequence number: a segment
// of remembered identities (segmentValue); a tombstone forgets it.
const kindDedupe = 'd'

// withDefaults fills in d's defaults.
func (d DedupeOptions) withDefaults() DedupeOptions {
	if d.Window == 0 {
		d.Window = DefaultDedupeWindow
	}
	if d.MaxIDs == 0 {
		d.MaxIDs = DefaultDedupeMaxIDs
	}
	return d
}

// validate reports d's problems to bad.
func (d DedupeOptions) validate(bad func(field, format string, args ...any)) {
	if d.Window < 0 {
		bad("Dedupe.Window", "is %s; set a positive duration (0 selects %s)", d.Window, DefaultDedupeWindow)
	}
	if d.MaxIDs < 0 {
		bad("Dedupe.MaxIDs", "is %d; set a positive count (0 selects %d)", d.MaxIDs, DefaultDedupeMaxIDs)
	}
	if d.MaxIDs > maxDedupeIDs {
		bad("Dedupe.MaxIDs", "is %d; set at most %d: each partition keeps its identities in the member's memory", d.MaxIDs, maxDedupeIDs)
	}
}

// guardRef is what the guard found of an input: its partition's state
// (nil: not an input) and its identity.
type guardRef struct {
	pv *partVersions
	id idKey
}

// guardPart returns the guard's state of rec's partition: nil without
// Options.Dedupe, or for a record of no input (a retry topic's).
func (s *kafkaScope) guardPart(rec *consumer.Record) *partVersions {
	if s.o.Dedupe == nil {
		return nil
	}
	return s.vs.get(tp{rec.Topic, rec.Partition})
}

// duplicate looks rec, an input of the partition whose guard state is pv,
// up: when it repeats one whose identity is remembered, it ends rec as a
// duplicate in the transaction w joins and reports true. Otherwise it
// returns what w remembers once rec's handler succeeded (work.remember).
// id is rec's key when Process computed it with its batch's (nil: not).
func (s *kafkaScope) duplicate(w *work, rec *consumer.Record, pv *partVersions, id *idKey) (guardRef, bool) {
	g := guardRef{pv: pv}
	if id != nil {
		g.id = *id
	} else {
		g.id = s.idKeyOf(rec)
	}
	if !pv.seenID(g.id, s.o.Dedupe.Window) {
		return g, false
	}
	s.obs.Event(rec, hook.EventDuplicate, hook.DuplicateKafkaGuard)
	w.do(func(tx *txnState) {
		tx.records.Add(1)
		tx.duplicates.Add(1)
		tx.end(s.obs, rec, hook.OutcomeDuplicate, nil)
	})
	return g, true
}

// idKeyOf returns the guard's key of rec's identity.
func (s *kafkaScope) idKeyOf(rec *consumer.Record) idKey {
	var a [128]byte // the identity, on the stack when it fits
	return keyOfID(s.cfg.Identity.Append(a[:0], rec))
}

// batchKeys are the guard's keys of a batch's inputs, reused batch after
// batch.
var batchKeys = sync.Pool{New: func() any { return new([]idKey) }}

// touchBatch computes the guard's keys of batch, inputs of the partition
// whose guard state is pv, into *keys, and readies their lookups
// (idMemory.touch).
func (s *kafkaScope) touchBatch(pv *partVersions, batch []*consumer.Record, keys *[]idKey) {
	ks := (*keys)[:0]
	for _, rec := range batch {
		ks = append(ks, s.idKeyOf(rec))
	}
	*keys = ks
	pv.touchIDs(ks)
}

// writeRemembered produces, in the transaction that ends, one changelog
// record per segment of the identities it remembered in each partition,
// and a tombstone per segment it forgets.
func (s *kafkaScope) writeRemembered(ctx context.Context) {
	if s.o.Dedupe == nil {
		return
	}
	now := time.Now()
	for k, pv := range s.vs.each() {
		segs, forget := pv.writeIDs(now, s.o.Dedupe.Window, s.o.Dedupe.MaxIDs)
		for _, seg := range segs {
			s.cur.produce(ctx, s.sess, changelogRecord(s.cfg.Group, k.topic, k.partition, segmentKey(seg.seq), segmentValue(seg)), nil,
				producedChangelog, func() string { return "the remembered identities" }, s.limit, nil)
		}
		for _, seq := range forget {
			s.cur.produce(ctx, s.sess, changelogRecord(s.cfg.Group, k.topic, k.partition, segmentKey(seq), nil), nil,
				producedChangelog, func() string { return "a forgotten segment of remembered identities" }, s.limit, nil)
		}
	}
}
