package txn

import (
	"context"
	"fmt"
	"strconv"
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
// partition, the oldest forgotten first): a duplicate that comes later is
// handled again. Each remembered identity costs about 100 bytes plus its
// length in the member's memory, and one record in the changelog until it
// is forgotten (a tombstone then). A duplicate must carry the identity
// of its original (the producer's message-id header: records identified by
// their coordinates are never duplicates of one another) and its key (so
// it lands in the same partition). An input that succeeds on a retry
// topic's hop (Unordered) is not remembered.
type DedupeOptions struct {
	// Window is how long an identity is remembered. Default
	// DefaultDedupeWindow.
	Window time.Duration
	// MaxIDs bounds the identities remembered per input partition.
	// Default DefaultDedupeMaxIDs.
	MaxIDs int
}

// Changelog record key 'd' + identity: the identity was remembered at the
// value's time (Unix milliseconds, decimal); a tombstone forgets it.
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
}

// duplicate reports whether rec, an input, repeats one whose identity is
// remembered; then it ends rec as a duplicate in the transaction w joins.
func (s *kafkaScope) duplicate(w *work, rec *consumer.Record) bool {
	pv := s.vs.get(tp{rec.Topic, rec.Partition})
	if pv == nil {
		return false // not an input (a retry topic's record)
	}
	if !pv.seenID(s.cfg.Identity.Of(rec), time.Now(), s.o.Dedupe.Window) {
		return false
	}
	s.obs.Event(rec, hook.EventDuplicate, "")
	w.do(func(tx *txnState) {
		tx.records.Add(1)
		tx.duplicates.Add(1)
		tx.end(s.obs, rec, hook.OutcomeDuplicate, nil)
	})
	return true
}

// remember remembers the identity of rec, whose handler succeeded, in the
// transaction w joins: in the partition's state, and in the changelog with
// the tombstones of identities it forgets.
func (s *kafkaScope) remember(ctx context.Context, w *work, rec *consumer.Record) {
	pv := s.vs.get(tp{rec.Topic, rec.Partition})
	if pv == nil {
		return
	}
	id := s.cfg.Identity.Of(rec)
	now := time.Now()
	w.do(func(tx *txnState) {
		tx.remembered.Add(1)
		for _, old := range pv.rememberID(id, now, s.o.Dedupe.Window, s.o.Dedupe.MaxIDs) {
			s.changelogNow(ctx, tx, w, rec, append([]byte{kindDedupe}, old...), nil)
		}
	})
	s.changelog(ctx, w, rec.Topic, rec.Partition, append([]byte{kindDedupe}, id...), strconv.AppendInt(nil, now.UnixMilli(), 10))
}

// changelogNow produces a changelog record of rec's partition in tx, from
// a function w runs as it joins.
func (s *kafkaScope) changelogNow(ctx context.Context, tx *txnState, w *work, rec *consumer.Record, key, value []byte) {
	out := changelogRecord(s.cfg.Group, rec.Topic, rec.Partition, key, value)
	tx.produce(ctx, s.sess, out, w.rec, producedChangelog, "a dedupe changelog tombstone", s.limit, nil)
}

// parseRemembered reads a dedupe changelog record's time.
func parseRemembered(v []byte) (int64, error) {
	ms, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("remembered identity's time %q: %w", v, err)
	}
	return ms, nil
}
