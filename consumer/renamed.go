package consumer

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// renamedCheckTimeout bounds warnEarlierGroups's lookups.
const renamedCheckTimeout = 10 * time.Second

// warnEarlierGroups logs a warning, on a group's first start (no committed
// offset on its topics), for each other consumer group of the cluster
// that consumed the same topics (it has committed offsets on them) and
// whose retry topics still hold records it has not consumed. A group
// renamed between two deployments is such a first start: the records the
// earlier group left in its retry topics are consumed by a member of that
// group only, so the new one never handles them. A lookup that fails is
// logged at debug level: the check is advisory.
func warnEarlierGroups(ctx context.Context, cfg Config) {
	ctx, cancel := context.WithTimeout(ctx, renamedCheckTimeout)
	defer cancel()
	err := func() error {
		cl, err := kgo.NewClient(append(append([]kgo.Opt{}, cfg.ClientOptions...), kgo.SeedBrokers(cfg.Brokers...))...)
		if err != nil {
			return err
		}
		defer cl.Close()
		look := groupLookup{ctx: ctx, adm: kadm.NewClient(cl)}
		if _, mine, err := look.committed(cfg.Group, cfg.Topics...); err != nil || mine {
			return err
		}
		groups, err := look.adm.ListGroups(ctx)
		if err != nil {
			return err
		}
		all, err := look.adm.ListTopics(ctx)
		if err != nil {
			return err
		}
		for _, g := range groups.Groups() {
			if g == cfg.Group {
				continue
			}
			if err := look.warnIfLeft(cfg, g, all); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil && ctx.Err() == nil {
		cfg.Logger.Debug("kscope: could not look for retry topics that an earlier group left records in", "err", err)
	}
}

// groupLookup reads other groups' committed offsets, for warnEarlierGroups.
type groupLookup struct {
	ctx context.Context
	adm *kadm.Client
}

// committed returns group's committed offsets on topics, and whether it
// committed any (a group that does not exist committed none).
func (l groupLookup) committed(group string, topics ...string) (kadm.OffsetResponses, bool, error) {
	got, err := l.adm.FetchOffsetsForTopics(l.ctx, group, topics...)
	if err == nil {
		err = got.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	some := false
	got.Each(func(o kadm.OffsetResponse) { some = some || o.At >= 0 })
	return got, some, nil
}

// warnIfLeft logs the warning of warnEarlierGroups when group g consumed
// cfg's topics and has records waiting in its retry topics (among all).
func (l groupLookup) warnIfLeft(cfg Config, g string, all kadm.TopicDetails) error {
	var retries []string
	for t := range all {
		if _, ok := retrytopic.RetryTopicDelay(g, t); ok {
			retries = append(retries, t)
		}
	}
	if len(retries) == 0 {
		return nil
	}
	if _, read, err := l.committed(g, cfg.Topics...); err != nil || !read {
		return err
	}
	offs, _, err := l.committed(g, retries...)
	if err != nil {
		return err
	}
	left, err := unconsumed(l.ctx, l.adm, offs, retries)
	if err != nil {
		return err
	}
	var holding []string
	var waiting int64
	for t, n := range left {
		holding = append(holding, t)
		waiting += n
	}
	if len(holding) == 0 {
		return nil
	}
	slices.Sort(holding)
	cfg.Logger.Warn("kscope: this group has no committed offset on its topics, and another group that consumed them has records waiting in its "+
		"retry topics, which only a member of that group consumes: if this group replaces it (a renamed group), those records are never "+
		"handled. Keep the earlier group id, or run a member of the earlier group until its retry topics are consumed",
		"earlier_group", g, "retry_topics", holding, "records", waiting, "topics", cfg.Topics)
	return nil
}
