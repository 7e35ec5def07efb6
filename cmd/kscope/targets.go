package main

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// logTargets returns the move of each partition of o.topic to o's
// target, from the offsets current returns (a partition it leaves out
// has none: -1).
func logTargets(ctx context.Context, adm *kadm.Client, o *replayOpts, at time.Time, current func(context.Context) (map[int32]int64, error)) (map[int32]*replayPlan, error) {
	listed := func(what string, l kadm.ListedOffsets, err error) (kadm.ListedOffsets, error) {
		if err == nil {
			err = l.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("listing the %s offsets of %q: %w", what, o.topic, err)
		}
		return l, nil
	}
	l, err := adm.ListStartOffsets(ctx, o.topic)
	starts, err := listed("start", l, err)
	if err != nil {
		return nil, err
	}
	l, err = adm.ListEndOffsets(ctx, o.topic)
	ends, err := listed("end", l, err)
	if err != nil {
		return nil, err
	}
	var byTime kadm.ListedOffsets
	if o.toTime != "" {
		l, err = adm.ListOffsetsAfterMilli(ctx, at.UnixMilli(), o.topic)
		if byTime, err = listed("time", l, err); err != nil {
			return nil, err
		}
	}
	committed, err := current(ctx)
	if err != nil {
		return nil, err
	}
	plan := make(map[int32]*replayPlan)
	for p, s := range starts[o.topic] {
		end, _ := ends.Lookup(o.topic, p)
		pl := &replayPlan{committed: -1, epoch: -1}
		if c, ok := committed[p]; ok {
			pl.committed = c
		}
		switch {
		case o.toStart:
			pl.target, pl.epoch = s.Offset, s.LeaderEpoch
		case o.toEnd:
			pl.target, pl.epoch = end.Offset, end.LeaderEpoch
		case o.toTime != "":
			t, ok := byTime.Lookup(o.topic, p)
			if !ok || t.Offset < 0 {
				pl.target, pl.epoch = end.Offset, end.LeaderEpoch
			} else {
				pl.target, pl.epoch = t.Offset, t.LeaderEpoch
			}
		default:
			pl.target = o.toOffset
			if pl.target < s.Offset {
				pl.target, pl.clamped = s.Offset, true
			}
			if pl.target > end.Offset {
				pl.target, pl.clamped = end.Offset, true
			}
		}
		plan[p] = pl
	}
	return plan, nil
}
