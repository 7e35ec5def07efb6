package txn

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/kread"
)

// The version changelogs: reading them back, creating and checking them,
// and the partitioner that writes to them.

// readState reads the version state of the input partitions in parts
// from their changelogs (group's), read_committed up to the last stable
// offset: one partVersions per partition.
func readState(ctx context.Context, kcfg consumer.Config, group string, parts []tp) (map[tp]*partVersions, error) {
	byTopic := map[string]map[int32]kgo.Offset{}
	for _, k := range parts {
		vt := VersionsTopic(group, k.topic)
		if byTopic[vt] == nil {
			byTopic[vt] = map[int32]kgo.Offset{}
		}
		byTopic[vt][k.partition] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, kcfg.ClientOptions...),
		kgo.SeedBrokers(kcfg.Brokers...),
		kgo.ConsumePartitions(byTopic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100*time.Millisecond),
	)...)
	if err != nil {
		return nil, fmt.Errorf("kscope: creating the changelog reader: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topics := make([]string, 0, len(byTopic))
	for t := range byTopic {
		topics = append(topics, t)
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("kscope: listing the changelog start offsets: %w", err)
	}
	want := map[tp]bool{}
	for _, k := range parts {
		want[tp{VersionsTopic(group, k.topic), k.partition}] = true
	}
	ends, err := stableEnds(ctx, adm, topics, want)
	if err != nil {
		return nil, err
	}
	state := map[tp]*partVersions{}
	left := map[tp]int64{} // changelog partitions still to read, and their end
	src := map[string]string{}
	for _, k := range parts {
		state[k] = newPartVersions()
		vt := VersionsTopic(group, k.topic)
		src[vt] = k.topic
		start, _ := starts.Lookup(vt, k.partition)
		end, _ := ends.Lookup(vt, k.partition)
		if end.Offset > start.Offset {
			left[tp{vt, k.partition}] = end.Offset
		}
	}
	if err := readChangelog(ctx, cl, left, state, src); err != nil {
		return nil, err
	}
	return state, nil
}

// readChangelog reads the changelog partitions in left up to their end
// (read_committed) and applies their records to the state of the input
// partition each belongs to (src maps a changelog topic to its input).
func readChangelog(ctx context.Context, cl *kgo.Client, left map[tp]int64, state map[tp]*partVersions, src map[string]string) error {
	ends := map[string]map[int32]int64{}
	for k, end := range left {
		if ends[k.topic] == nil {
			ends[k.topic] = map[int32]int64{}
		}
		ends[k.topic][k.partition] = end
	}
	err := kread.ToEnd(ctx, cl, ends, kread.Options{}, func(r *kgo.Record) error {
		if err := state[tp{src[r.Topic], r.Partition}].apply(r); err != nil {
			return fmt.Errorf("%s[%d]@%d is corrupt: %w", r.Topic, r.Partition, r.Offset, err)
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("kscope: reading the changelog: %w", err)
	}
	return err
}

// stableEnds waits until no transaction is open on the changelog
// partitions (the last stable offset is the high watermark) and returns
// their end offsets. Only the partitions in want are waited for: the
// others may carry this member's own open transaction. A previous owner's last transaction may have
// committed without its markers having reached the changelog yet: the
// last stable offset then lies before its records, and a restore up to it
// would be one transaction behind the group's offsets. A transaction left
// open by a producer that died ends when it is aborted or times out.
func stableEnds(ctx context.Context, adm *kadm.Client, topics []string, want map[tp]bool) (kadm.ListedOffsets, error) {
	for attempt := 1; ; attempt++ {
		stable, err := adm.ListCommittedOffsets(ctx, topics...)
		if err == nil {
			err = stable.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("kscope: listing the changelog end offsets: %w", err)
		}
		hwm, err := adm.ListEndOffsets(ctx, topics...)
		if err == nil {
			err = hwm.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("kscope: listing the changelog end offsets: %w", err)
		}
		open := false
		stable.Each(func(o kadm.ListedOffset) {
			if h, ok := hwm.Lookup(o.Topic, o.Partition); ok && h.Offset > o.Offset && want[tp{o.Topic, o.Partition}] {
				open = true
			}
		})
		if !open {
			return stable, nil
		}
		if !backoff.Sleep(ctx, backoff.Delay(attempt, 20*time.Millisecond, time.Second)) {
			return nil, ctx.Err()
		}
	}
}

// ensureChangelogs creates a compacted changelog for every input topic,
// with as many partitions as the input, and checks existing ones.
func ensureChangelogs(ctx context.Context, cfg consumer.Config) error {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, cfg.ClientOptions...), kgo.SeedBrokers(cfg.Brokers...))...)
	if err != nil {
		return fmt.Errorf("kscope: creating the Kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	names := make([]string, 0, 2*len(cfg.Topics))
	for _, t := range cfg.Topics {
		names = append(names, t, VersionsTopic(cfg.Group, t))
	}
	td, err := adm.ListTopics(ctx, names...)
	if err != nil {
		return fmt.Errorf("kscope: looking up the version changelogs: %w", err)
	}
	compact := "compact"
	for _, t := range cfg.Topics {
		in, ok := td[t]
		if !ok || in.Err != nil {
			return fmt.Errorf("kscope: input topic %s does not exist; the version changelog needs its partition count: create it first", t)
		}
		vt := VersionsTopic(cfg.Group, t)
		if d, ok := td[vt]; ok && d.Err == nil {
			if len(d.Partitions) < len(in.Partitions) {
				return fmt.Errorf("kscope: version changelog %s has %d partitions but input %s has %d; add partitions to the changelog to match", vt, len(d.Partitions), t, len(in.Partitions))
			}
			continue
		}
		if cfg.Failures.DoNotCreateTopics {
			return fmt.Errorf("kscope: the version changelog %s does not exist and Config.Failures.DoNotCreateTopics is set; create it (cleanup.policy=compact, %d partitions), or unset DoNotCreateTopics", vt, len(in.Partitions))
		}
		resp, err := adm.CreateTopic(ctx, int32(len(in.Partitions)), -1, map[string]*string{"cleanup.policy": &compact}, vt)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("kscope: creating the version changelog %s failed (%w); create it yourself (cleanup.policy=compact, %d partitions), or grant this client CREATE", vt, err, len(in.Partitions))
		}
	}
	return nil
}

// changelogPartitioner sends changelog records to the partition they name
// (the input's) and everything else through kgo's default partitioner.
type changelogPartitioner struct {
	group string
	logs  map[string]bool
	def   kgo.Partitioner
}

func newChangelogPartitioner(group string, topics []string) changelogPartitioner {
	logs := map[string]bool{}
	for _, t := range topics {
		logs[VersionsTopic(group, t)] = true
	}
	return changelogPartitioner{group: group, logs: logs, def: kgo.UniformBytesPartitioner(64<<10, true, true, nil)}
}

func (c changelogPartitioner) ForTopic(t string) kgo.TopicPartitioner {
	if c.logs[t] {
		return kgo.ManualPartitioner().ForTopic(t)
	}
	return c.def.ForTopic(t)
}
