package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// PauseTopic returns the name of group's pause topic,
// "<group>.kscope-pauses": a compacted topic of one partition that keeps
// the pauses given [PersistPause], one record per target and reason (a
// tombstone once it ended). The runner creates it at the first such
// pause; topic patterns never match it.
func PauseTopic(group string) string { return retrytopic.SafeName(group) + ".kscope-pauses" }

// PersistPause keeps the pause across restarts: Runner.Pause writes it to
// the group's pause topic ([PauseTopic]) before it returns, and every
// member of the group that starts later reads the topic at its first
// assignment and starts with the pause in force, until Resume (which
// writes its end there) or its PauseFor time. Members already running
// do not read the topic again, so they see the pause only when they
// restart: pause each of them too. Without it a pause lives in the runner
// only.
func PersistPause() PauseOption { return func(s *pauseSpec) { s.persist = true } }

// storeTimeout bounds a write to, or the read of, the pause topic.
const storeTimeout = 10 * time.Second

// storedPause is a persisted pause, the value of its record.
type storedPause struct {
	Kind      uint8     `json:"kind"` // targetKind
	Topic     string    `json:"topic,omitempty"`
	Partition int32     `json:"partition"`
	Reason    string    `json:"reason"`
	Since     time.Time `json:"since"`
	Until     time.Time `json:"until,omitzero"`
}

// storeKey is the key of p's record in the pause topic.
func storeKey(p PausedTarget) []byte {
	t := p.Target
	return []byte(strconv.Itoa(int(t.kind)) + "\x00" + t.topic + "\x00" + strconv.Itoa(int(t.partition)) + "\x00" + p.Reason)
}

// storeClient returns a client of the configured brokers (and the
// configured ClientOptions: TLS, SASL) for the pause topic.
func (r *Runner) storeClient(opts ...kgo.Opt) (*kgo.Client, error) {
	all := append(append([]kgo.Opt{}, r.cfg.ClientOptions...), kgo.SeedBrokers(r.cfg.Brokers...))
	return kgo.NewClient(append(all, opts...)...)
}

// store writes p to the pause topic (on) or its end (a tombstone),
// creating the topic when it is missing.
func (r *Runner) store(p PausedTarget, on bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	cl, err := r.storeClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	topic := PauseTopic(r.cfg.Group)
	rec := &kgo.Record{Topic: topic, Partition: 0, Key: storeKey(p)}
	if on {
		if rec.Value, err = json.Marshal(storedPause{Kind: uint8(p.Target.kind), Topic: p.Target.topic, Partition: p.Target.partition, Reason: p.Reason, Since: p.Since, Until: p.Until}); err != nil {
			return err
		}
		if err := ensurePauseTopic(ctx, kadm.NewClient(cl), topic); err != nil {
			return err
		}
	}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("kscope: writing the pause of %s to %s: %w", p.Target, topic, err)
	}
	return nil
}

// ensurePauseTopic creates the compacted pause topic unless it exists.
func ensurePauseTopic(ctx context.Context, adm *kadm.Client, topic string) error {
	compact := "compact"
	resp, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": &compact}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("kscope: creating the pause topic %s: %w", topic, err)
	}
	return nil
}

// loadStored reads the persisted pauses of the group, once per runner,
// before its first assignment is paused (pauseAssigned): the pauses in
// force that it finds join the runner's. A pause topic that cannot be
// read is logged; the runner goes on with the pauses it has.
func (r *Runner) loadStored() {
	r.pauseMu.Lock()
	loaded := r.pauseMu.user.loaded
	r.pauseMu.user.loaded = true
	r.pauseMu.Unlock()
	if loaded {
		return
	}
	stored, err := r.readStored()
	if err != nil {
		r.log.Warn("kscope: reading the persisted pauses failed; starting without them", "pause_topic", PauseTopic(r.cfg.Group), "err", err)
		return
	}
	now := time.Now()
	r.pauseMu.Lock()
	var added []PausedTarget
	for _, s := range stored {
		t := Target{kind: targetKind(s.Kind), topic: s.Topic, partition: s.Partition}
		if (!s.Until.IsZero() && !now.Before(s.Until)) || r.pauseMu.user.find(t, s.Reason) != nil || t.check() != nil {
			continue
		}
		up := &userPause{PausedTarget: PausedTarget{Target: t, Since: s.Since, Until: s.Until, Reason: s.Reason, Persisted: true}}
		if !s.Until.IsZero() {
			up.timer = time.AfterFunc(s.Until.Sub(now), func() { r.expire(up) })
		}
		r.pauseMu.user.list = append(r.pauseMu.user.list, up)
		added = append(added, up.PausedTarget)
	}
	r.pauseMu.Unlock()
	for _, p := range added {
		r.log.Info("kscope: paused fetching, as a persisted pause says", "target", p.Target.String(), "reason", p.Reason, "since", p.Since, "until", untilAttr(p.Until))
		r.observePause(p, true)
	}
}

// readStored returns the pauses the pause topic holds in force: the last
// record of each key that is not a tombstone.
func (r *Runner) readStored() ([]storedPause, error) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	topic := PauseTopic(r.cfg.Group)
	cl, err := r.storeClient()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	end, ok := ends.Lookup(topic, 0)
	switch {
	case !ok || errors.Is(end.Err, kerr.UnknownTopicOrPartition):
		return nil, nil // no pause was ever persisted
	case end.Err != nil:
		return nil, end.Err
	case end.Offset == 0:
		return nil, nil
	}
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}})
	// The last record is in the log's active segment, which compaction
	// leaves alone: the read reaches end.Offset.
	last := map[string][]byte{}
	var order []string
	for next := int64(0); next < end.Offset; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("reading %s up to offset %d: %w", topic, end.Offset, err)
		}
		if err := fs.Err0(); err != nil {
			return nil, err
		}
		fs.EachRecord(func(rec *kgo.Record) {
			k := string(rec.Key)
			if _, seen := last[k]; !seen {
				order = append(order, k)
			}
			last[k] = rec.Value
			next = rec.Offset + 1
		})
	}
	var out []storedPause
	for _, k := range order {
		v := last[k]
		if v == nil {
			continue // ended
		}
		var s storedPause
		if err := json.Unmarshal(v, &s); err != nil {
			r.log.Warn("kscope: a record of the pause topic is not a pause; ignored", "pause_topic", topic, "err", err)
			continue
		}
		out = append(out, s)
	}
	return out, nil
}
