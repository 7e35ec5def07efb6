package main

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// triage tracks, per partition of a dead-letter topic, how far a redrive
// has handled its records in offset order from the triage group's
// committed offset (retrytopic.TriageGroup), so that the redrive commits
// that far and the dead letters it handled stop counting as waiting
// (retrytopic.DeadLettersWaiting, kscope_dead_letters_waiting). A record
// the filters pass over, or one skipped, stops the partition's run: the
// offsets after it are not committed, and it and those after it wait on.
type triage struct {
	group     string          // the triage group; "" when the redrive commits nothing
	committed map[int32]int64 // its committed offsets when the redrive began
	from      int64           // --from-offset, -1 when none
	next      map[int32]int64 // per partition, the offset past the last record of the run
	broken    map[int32]bool  // partitions whose run a record not handled stopped
	bounds    map[int32]partitionBounds
}

// newTriage reads the committed offsets of group's triage group on topic;
// with group "" it tracks nothing.
func newTriage(ctx context.Context, adm *kadm.Client, kc *kafkaConn, group, topic string, rng scanRange) (*triage, error) {
	t := &triage{committed: map[int32]int64{}, from: rng.from, next: map[int32]int64{}, broken: map[int32]bool{}}
	if group == "" {
		return t, nil
	}
	t.group = retrytopic.TriageGroup(group)
	var got kadm.OffsetResponses
	err := kc.do(ctx, func(ctx context.Context) (err error) {
		got, err = retrytopic.TriageOffsets(ctx, adm, group, topic)
		return err
	})
	if err != nil {
		return nil, err
	}
	got.Each(func(o kadm.OffsetResponse) {
		if o.At >= 0 {
			t.committed[o.Partition] = o.At
		}
	})
	return t, nil
}

// starts reports whether the redrive reads partition p from the triage
// group's committed offset or before it: only then does a run from there
// cover every record in between.
func (t *triage) starts(p int32) bool {
	c, ok := t.committed[p]
	return t.from < 0 || ok && t.from <= c
}

// saw records that the redrive read r, and handled it (sent it, or passed
// over a later copy of an identity it sent) or not.
func (t *triage) saw(r *kgo.Record, handled bool) {
	if t.group == "" || t.broken[r.Partition] {
		return
	}
	if c, ok := t.committed[r.Partition]; ok && r.Offset < c {
		return // handled by an earlier triage
	}
	if !handled {
		t.broken[r.Partition] = true
		return
	}
	t.next[r.Partition] = r.Offset + 1
}

// commit commits, per partition, how far the redrive handled its records:
// when it read a partition to the end of its range without passing over
// a record, the range's end (past any transaction marker after the last
// record), else the offset past the run's last record. complete says the
// scan read every partition to its end. It returns what it committed.
func (t *triage) commit(ctx context.Context, adm *kadm.Client, kc *kafkaConn, topic string, complete bool) (map[int32]int64, error) {
	if t.group == "" {
		return nil, nil
	}
	offsets := kadm.Offsets{}
	done := map[int32]int64{}
	for p, b := range t.bounds {
		if !t.starts(p) {
			continue
		}
		to, ok := t.next[p]
		if complete && !t.broken[p] && b.end > b.begin {
			to, ok = b.end, true
		}
		if c, had := t.committed[p]; !ok || had && to <= c {
			continue
		}
		offsets.Add(kadm.Offset{Topic: topic, Partition: p, At: to, LeaderEpoch: -1})
		done[p] = to
	}
	if len(done) == 0 {
		return nil, nil
	}
	err := kc.do(ctx, func(ctx context.Context) error {
		resp, err := adm.CommitOffsets(ctx, t.group, offsets)
		if err == nil {
			err = resp.Error()
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("committing the handled offsets of %s under group %s (the records were redriven; kscope_dead_letters_waiting still counts them): %w", topic, t.group, err)
	}
	return done, nil
}

// triage returns the redrive's triage tracking: of group's triage group,
// none for a dry run or without --group.
func (rd *redriver) triage(ctx context.Context, group string, rng scanRange) (*triage, error) {
	if rd.o.dryRun {
		group = ""
	}
	return newTriage(ctx, rd.adm, rd.kc, group, rd.topic, rng)
}

// commitTriage commits what the redrive handled under the triage group
// and says so on stderr; complete says the scan read its whole range.
func (rd *redriver) commitTriage(ctx context.Context, complete bool) error {
	if rd.tr.group == "" {
		if !rd.o.dryRun && rd.st.sent > 0 {
			fmt.Fprintf(rd.e.stderr, "redrive: nothing committed for triage (give --group): kscope_dead_letters_waiting still counts these records\n")
		}
		return nil
	}
	done, err := rd.tr.commit(ctx, rd.adm, rd.kc, rd.topic, complete)
	for _, p := range sortedPartitions(rd.tr.bounds) {
		if to, ok := done[p]; ok {
			fmt.Fprintf(rd.e.stderr, "redrive: committed partition %d offset %d under group %s: the dead letters before it no longer wait\n", p, to, rd.tr.group)
		}
	}
	return err
}

// printWaiting ends dlt list's table with how many of group's dead letters
// in topic wait for triage: past what kscope dlt redrive committed under
// the triage group, as kscope_dead_letters_waiting counts them.
func printWaiting(ctx context.Context, e *env, adm *kadm.Client, kc *kafkaConn, group, topic string) {
	var waiting map[int32]int64
	err := kc.do(ctx, func(ctx context.Context) (err error) {
		waiting, err = retrytopic.DeadLettersWaiting(ctx, adm, group, topic)
		return err
	})
	if err != nil {
		fmt.Fprintf(e.stderr, "warning: cannot count the dead letters waiting for triage: %v\n", err)
		return
	}
	var n int64
	for _, w := range waiting {
		n += w
	}
	fmt.Fprintf(e.stdout, "%d waiting for triage (offsets past those kscope dlt redrive committed under group %s)\n", n, retrytopic.TriageGroup(group))
}
