package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
)

// defaultMaxScan is how many records replay reads, at most, to measure
// its blast radius (--max-scan).
const defaultMaxScan = 100000

// blastRadius is what a replay would give the group's consumers again,
// measured by reading the records between each partition's target and its
// committed offset.
type blastRadius struct {
	// Records are the data records read (transaction markers are not).
	Records int64 `json:"records"`
	// Keys is the number of distinct non-null keys among them.
	Keys int `json:"distinct_keys"`
	// NullKeys is the number of records without a key.
	NullKeys int64 `json:"records_without_key"`
	// First and Last are the earliest and latest record timestamps.
	First *time.Time `json:"first_timestamp,omitempty"`
	Last  *time.Time `json:"last_timestamp,omitempty"`
	// LowerBounds says that --max-scan stopped the read: the counts are
	// lower bounds, and the time range is of the records read.
	LowerBounds bool `json:"lower_bounds"`
	// Offsets is the number of offsets between the targets and the
	// committed offsets (what Records would be read from in full).
	Offsets int64 `json:"offsets"`
	MaxScan int   `json:"max_scan"`
	// NoOp is the expected no-op rate, for a DB-scope consumer whose
	// inbox was looked up; NoOpNote says why there is none otherwise.
	NoOp     *noOpRate `json:"no_op,omitempty"`
	NoOpNote string    `json:"no_op_note,omitempty"`

	keys map[string]struct{}
	ids  map[string]int64 // identity: records, when the inbox is looked up
}

// errScanCap stops a read that reached --max-scan records.
var errScanCap = errors.New("--max-scan reached")

// measureBlast reads, per partition that moves back, the records from its
// target up to its committed offset (at most o.maxScan records in all),
// and counts them; with idOf, it also keeps each record's identity.
func measureBlast(ctx context.Context, kc *kafkaConn, adm *kadm.Client, o *replayOpts, plan map[int32]*replayPlan, idOf func(*kgo.Record) string) (*blastRadius, error) {
	b := &blastRadius{MaxScan: o.maxScan, keys: map[string]struct{}{}}
	if idOf != nil {
		b.ids = map[string]int64{}
	}
	var all map[int32]partitionBounds
	err := kc.do(ctx, func(ctx context.Context) (err error) {
		all, err = listBounds(ctx, adm, o.topic, scanRange{partition: -1, from: -1, to: -1})
		return err
	})
	if err != nil {
		return nil, err
	}
	cl, err := kc.client(kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(), kgo.ConsumeResetOffset(kgo.NoResetOffset()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	for _, p := range sortedPartitions(plan) {
		pl := plan[p]
		if pl.committed < 0 || pl.target >= pl.committed {
			continue
		}
		b.Offsets += pl.committed - pl.target
		if b.LowerBounds {
			continue
		}
		end := min(pl.committed, all[p].end)
		if pl.target >= end {
			continue
		}
		err := scanPartition(ctx, cl, adm, o.topic, p, partitionBounds{begin: pl.target, end: end}, defaultIdleTimeout, func(r *kgo.Record) error {
			if b.Records >= int64(o.maxScan) {
				return errScanCap
			}
			b.add(r, idOf)
			return nil
		})
		switch {
		case errors.Is(err, errScanCap):
			b.LowerBounds = true
		case err != nil:
			return nil, fmt.Errorf("reading the records the replay would give again: %w", err)
		}
	}
	b.Keys = len(b.keys)
	return b, nil
}

// add counts r.
func (b *blastRadius) add(r *kgo.Record, idOf func(*kgo.Record) string) {
	b.Records++
	if r.Key == nil {
		b.NullKeys++
	} else {
		b.keys[string(r.Key)] = struct{}{}
	}
	ts := r.Timestamp.UTC()
	if b.First == nil || ts.Before(*b.First) {
		b.First = &ts
	}
	if b.Last == nil || ts.After(*b.Last) {
		t := ts
		b.Last = &t
	}
	if idOf != nil {
		b.ids[idOf(r)]++
	}
}

// identityOf returns the function that computes a record's identity as a
// runner configured with consumer.Config.Identity{Header: header} does.
func identityOf(header string) func(*kgo.Record) string {
	id := consumer.Identity{Header: header}
	return func(r *kgo.Record) string { return id.Of(&consumer.Record{Record: r}) }
}

// print writes the blast radius.
func (b *blastRadius) print(w io.Writer) {
	atLeast := ""
	if b.LowerBounds {
		atLeast = "at least "
		fmt.Fprintf(w, "blast radius (lower bounds: --max-scan %d reached before the %d offsets to replay were read; raise it for exact counts):\n", b.MaxScan, b.Offsets)
	} else {
		fmt.Fprintln(w, "blast radius:")
	}
	fmt.Fprintf(w, "  records:       %s%d\n", atLeast, b.Records)
	keys := fmt.Sprintf("%s%d", atLeast, b.Keys)
	if b.NullKeys > 0 {
		keys += fmt.Sprintf(" (and %s%s without a key)", atLeast, plural64(b.NullKeys, "record"))
	}
	fmt.Fprintf(w, "  distinct keys: %s\n", keys)
	if b.First != nil {
		fmt.Fprintf(w, "  time range:    %s to %s\n", b.First.Format(time.RFC3339Nano), b.Last.Format(time.RFC3339Nano))
	}
	switch {
	case b.NoOp != nil:
		fmt.Fprintf(w, "  expected no-op rate: %s\n", b.NoOp)
	case b.NoOpNote != "":
		fmt.Fprintf(w, "  expected no-op rate: %s\n", b.NoOpNote)
	}
}

// percent formats p without a useless ".0".
func percent(p float64) string {
	return strings.TrimSuffix(fmt.Sprintf("%.1f", p), ".0") + "%"
}
