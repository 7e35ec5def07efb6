package txn

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/kread"
	"github.com/kscope-dev/kscope/sequence"
)

// VersionsTopic is the compacted changelog topic that holds, for consumer
// group group, the last applied version of every key of input topic topic
// and the records parked behind a version gap. Its partition p holds the
// keys of the input's partition p, so the member that owns an input
// partition owns its versions: it writes them in the same transaction as
// the outputs and restores them when the partition is assigned to it.
func VersionsTopic(group, topic string) string {
	return group + ".kscope-versions." + topic
}

// Changelog record keys: 'v' + key holds the last applied version (a
// decimal); 'p' + 8-byte big-endian version + key holds a parked record (a
// JSON parkedRec), deleted by a tombstone when it leaves the park.
const (
	kindVersion = 'v'
	kindParked  = 'p'
)

// parkedRec is a record waiting for the versions before it.
type parkedRec struct {
	Version   int64              `json:"version"`
	Topic     string             `json:"topic"`
	Partition int32              `json:"partition"`
	Offset    int64              `json:"offset"`
	Timestamp time.Time          `json:"timestamp"`
	Key       []byte             `json:"key"`
	Value     []byte             `json:"value"`
	Headers   []kgo.RecordHeader `json:"headers"`
	Since     time.Time          `json:"since"` // when it was first parked
	// Others are the other records of the key with the same version
	// (another source record, another identity) that arrived while it
	// waited, in arrival order. They share its changelog record and its
	// fate: when it is released, the first of them that is applied (or
	// skipped) applies the version and the rest are stale; when it times
	// out, they go to the dead-letter topic with it.
	Others []*parkedRec `json:"others,omitempty"`
}

func (p *parkedRec) record() *consumer.Record {
	return &consumer.Record{Record: &kgo.Record{
		Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, Timestamp: p.Timestamp,
		Key: p.Key, Value: p.Value, Headers: p.Headers,
	}}
}

// all returns p and the records parked with it, in arrival order.
func (p *parkedRec) all() []*parkedRec {
	return append([]*parkedRec{p}, p.Others...)
}

// holds reports whether rec is p or one of the records parked with it
// delivered again: the same source record (topic, partition, offset), or
// the same identity.
func (p *parkedRec) holds(rec *consumer.Record, id consumer.Identity) bool {
	rid := id.Of(rec)
	for _, c := range p.all() {
		if c.Topic == rec.Topic && c.Partition == rec.Partition && c.Offset == rec.Offset {
			return true
		}
		if id.Of(c.record()) == rid {
			return true
		}
	}
	return false
}

// with returns a copy of p with o parked with it, last.
func (p *parkedRec) with(o *parkedRec) *parkedRec {
	q := *p
	q.Others = append(slices.Clip(p.Others), o)
	return &q
}

func parkedKey(key []byte, v int64) []byte {
	b := make([]byte, 0, 9+len(key))
	b = append(b, kindParked)
	b = binary.BigEndian.AppendUint64(b, uint64(v))
	return append(b, key...)
}

// partVersions is the version state of one input partition: what the
// changelog holds (committed) and what the open transaction changed
// (pending), which becomes committed only when the transaction does.
type partVersions struct {
	mu      sync.Mutex
	last    map[string]int64
	parked  map[string]map[int64]*parkedRec
	pLast   map[string]int64
	pParked map[string]map[int64]*parkedRec // a nil entry: removed in this transaction
}

func newPartVersions() *partVersions {
	return &partVersions{
		last: map[string]int64{}, parked: map[string]map[int64]*parkedRec{},
		pLast: map[string]int64{}, pParked: map[string]map[int64]*parkedRec{},
	}
}

func (pv *partVersions) lastOf(key string) (int64, bool) {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if v, ok := pv.pLast[key]; ok {
		return v, true
	}
	v, ok := pv.last[key]
	return v, ok
}

func (pv *partVersions) setLast(key string, v int64) {
	pv.mu.Lock()
	pv.pLast[key] = v
	pv.mu.Unlock()
}

func (pv *partVersions) parkedAt(key string, v int64) *parkedRec {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if m, ok := pv.pParked[key]; ok {
		if p, ok := m[v]; ok {
			return p // nil when removed in this transaction
		}
	}
	return pv.parked[key][v]
}

func (pv *partVersions) setParked(key string, v int64, p *parkedRec) {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if pv.pParked[key] == nil {
		pv.pParked[key] = map[int64]*parkedRec{}
	}
	pv.pParked[key][v] = p
}

// end makes the transaction's changes committed, or drops them.
func (pv *partVersions) end(committed bool) {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if committed {
		for k, v := range pv.pLast {
			pv.last[k] = v
		}
		for k, m := range pv.pParked {
			for v, p := range m {
				pv.applyParked(k, v, p)
			}
		}
	}
	clear(pv.pLast)
	clear(pv.pParked)
}

func (pv *partVersions) applyParked(key string, v int64, p *parkedRec) {
	if p == nil {
		delete(pv.parked[key], v)
		if len(pv.parked[key]) == 0 {
			delete(pv.parked, key)
		}
		return
	}
	if pv.parked[key] == nil {
		pv.parked[key] = map[int64]*parkedRec{}
	}
	pv.parked[key][v] = p
}

// expired returns the committed parked records that have waited longer
// than timeout.
func (pv *partVersions) expired(now time.Time, timeout time.Duration) []*parkedRec {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	var out []*parkedRec
	for _, m := range pv.parked {
		for _, p := range m {
			if now.Sub(p.Since) > timeout {
				out = append(out, p)
			}
		}
	}
	return out
}

// nextExpiry returns when the next parked record times out (zero if none).
func (pv *partVersions) nextExpiry(timeout time.Duration, skip map[*parkedRec]bool) time.Time {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	var next time.Time
	for _, m := range pv.parked {
		for _, p := range m {
			if skip[p] {
				continue
			}
			if at := p.Since.Add(timeout); next.IsZero() || at.Before(next) {
				next = at
			}
		}
	}
	return next
}

// apply loads one changelog record.
func (pv *partVersions) apply(r *kgo.Record) error {
	if len(r.Key) == 0 {
		return errors.New("empty key")
	}
	switch r.Key[0] {
	case kindVersion:
		if r.Value == nil {
			delete(pv.last, string(r.Key[1:]))
			return nil
		}
		v, err := strconv.ParseInt(string(r.Value), 10, 64)
		if err != nil {
			return fmt.Errorf("version %q: %w", r.Value, err)
		}
		pv.last[string(r.Key[1:])] = v
	case kindParked:
		if len(r.Key) < 9 {
			return errors.New("short parked key")
		}
		v := int64(binary.BigEndian.Uint64(r.Key[1:9]))
		key := string(r.Key[9:])
		if r.Value == nil {
			pv.applyParked(key, v, nil)
			return nil
		}
		var p parkedRec
		if err := json.Unmarshal(r.Value, &p); err != nil {
			return fmt.Errorf("parked record: %w", err)
		}
		pv.applyParked(key, v, &p)
	default:
		return fmt.Errorf("unknown record kind %q", r.Key[0])
	}
	return nil
}

// versionStore is the Kafka scope's version state: one partVersions per
// owned input partition, restored from the changelog on first use after
// the partition is assigned.
type versionStore struct {
	cfg   sequence.Config
	group string
	kcfg  consumer.Config

	mu    sync.Mutex
	parts map[tp]*partVersions
	owned map[tp]uint64 // assigned partitions and their assignment's generation
	gen   uint64
	kick  func()

	expiringSet map[*parkedRec]bool // parked records dispatched to be expired
}

// assigned notes newly assigned partitions once the group's offsets of
// them have been fetched stably (so no transaction of a previous owner is
// still pending on them): the poll loop restores their state before it
// handles any of their records.
func (s *versionStore) assigned(ps map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for t, parts := range ps {
		for _, p := range parts {
			s.gen++
			s.owned[tp{t, p}] = s.gen
			delete(s.parts, tp{t, p})
		}
	}
	if s.kick != nil {
		s.kick()
	}
}

// missing returns the owned input partitions whose state is not loaded,
// with their assignment generation.
func (s *versionStore) missing(inputs []string) map[tp]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out map[tp]uint64
	for k, gen := range s.owned {
		if s.parts[k] != nil || !slices.Contains(inputs, k.topic) {
			continue
		}
		if out == nil {
			out = map[tp]uint64{}
		}
		out[k] = gen
	}
	return out
}

// setKick registers the function that wakes the poll loop when partitions
// are assigned, so that they are restored (and their parked records time
// out) even before records arrive.
func (s *versionStore) setKick(f func()) {
	s.mu.Lock()
	s.kick = f
	pending := len(s.owned) > 0
	s.mu.Unlock()
	if pending {
		f() // partitions were assigned before the runner could be woken
	}
}

// takeExpired returns the parked records of every owned partition that
// have waited past GapTimeout and are not being expired already, and notes
// them as being expired.
func (s *versionStore) takeExpired(now time.Time) []*parkedRec {
	var out []*parkedRec
	for _, pv := range s.all() {
		for _, p := range pv.expired(now, s.cfg.GapTimeout) {
			s.mu.Lock()
			if !s.expiringSet[p] {
				s.expiringSet[p] = true
				out = append(out, p)
			}
			s.mu.Unlock()
		}
	}
	return out
}

// expiring notes whether p is being expired by a worker.
func (s *versionStore) expiring(p *parkedRec, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.expiringSet[p] = true
	} else {
		delete(s.expiringSet, p)
	}
}

// nextExpiry returns when the next parked record that is not being
// expired times out (zero if none).
func (s *versionStore) nextExpiry() time.Time {
	var next time.Time
	for _, pv := range s.all() {
		s.mu.Lock()
		skip := s.expiringSet
		at := pv.nextExpiry(s.cfg.GapTimeout, skip)
		s.mu.Unlock()
		if !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return next
}

func (s *versionStore) get(k tp) *partVersions {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.parts[k]
}

func (s *versionStore) all() []*partVersions {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*partVersions, 0, len(s.parts))
	for _, pv := range s.parts {
		out = append(out, pv)
	}
	return out
}

// drop forgets the state of partitions this member no longer owns: their
// next owner restores it from the changelog, and so does this member if
// they come back.
func (s *versionStore) drop(ps map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for t, parts := range ps {
		for _, p := range parts {
			delete(s.parts, tp{t, p})
			delete(s.owned, tp{t, p})
		}
	}
}

// end commits or drops every partition's pending changes.
func (s *versionStore) end(committed bool) {
	for _, pv := range s.all() {
		pv.end(committed)
	}
}

// restore loads the state of the partitions in need from their changelogs,
// read_committed up to the last stable offset. A partition revoked or
// reassigned meanwhile (its generation changed) is not installed.
func (s *versionStore) restore(ctx context.Context, need map[tp]uint64) error {
	if len(need) == 0 {
		return nil
	}
	state, err := readState(ctx, s.kcfg, s.group, slices.Collect(maps.Keys(need)))
	if err != nil {
		return err
	}
	s.mu.Lock()
	for k, pv := range state {
		if s.owned[k] == need[k] {
			s.parts[k] = pv
		}
	}
	s.mu.Unlock()
	return nil
}

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

// parkedLookupTimeout bounds checkNoParked's lookup of the changelogs.
const parkedLookupTimeout = 5 * time.Second

// checkNoParked is Start's check for a runner without Options.Versions:
// a record that a deployment with Versions parked in a version changelog
// behind a gap has its input offset committed, and only a runner with
// Versions applies it (when the gap fills) or dead-letters it (after
// GapTimeout). While one waits, it returns a *consumer.ConfigError on
// Versions that says how many wait and what to do. Otherwise it returns
// the changelogs it read (none when Versions was never set). A changelog
// that cannot be read is reported by the error, which Start logs.
func checkNoParked(ctx context.Context, cfg consumer.Config) (ce *consumer.ConfigError, changelogs []string, err error) {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, cfg.ClientOptions...), kgo.SeedBrokers(cfg.Brokers...))...)
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	names := make([]string, 0, len(cfg.Topics))
	for _, t := range cfg.Topics {
		names = append(names, VersionsTopic(cfg.Group, t))
	}
	// Bounded: a broker that refuses the client's setup is reported by
	// the runner's own first lookup (consumer.ErrBrokerSetup).
	lctx, cancel := context.WithTimeout(ctx, parkedLookupTimeout)
	td, err := kadm.NewClient(cl).ListTopics(lctx, names...)
	cancel()
	if err != nil {
		return nil, nil, err
	}
	var parts []tp
	for _, t := range cfg.Topics {
		if d, ok := td[VersionsTopic(cfg.Group, t)]; ok && d.Err == nil {
			for p := range d.Partitions {
				parts = append(parts, tp{t, p})
			}
		}
	}
	if len(parts) == 0 {
		return nil, nil, nil // no changelog: Versions was never set
	}
	state, err := readState(ctx, cfg, cfg.Group, parts)
	if err != nil {
		return nil, nil, err
	}
	count := map[string]int{}
	var oldest time.Time
	for k, pv := range state {
		for _, m := range pv.parked {
			for _, p := range m {
				count[k.topic]++
				if oldest.IsZero() || p.Since.Before(oldest) {
					oldest = p.Since
				}
			}
		}
	}
	if len(count) == 0 {
		seen := map[string]bool{}
		for _, k := range parts {
			if vt := VersionsTopic(cfg.Group, k.topic); !seen[vt] {
				seen[vt] = true
				changelogs = append(changelogs, vt)
			}
		}
		return nil, changelogs, nil
	}
	var where []string
	for _, t := range cfg.Topics {
		if n := count[t]; n > 0 {
			where = append(where, fmt.Sprintf("%d in %s", n, VersionsTopic(cfg.Group, t)))
		}
	}
	return &consumer.ConfigError{Struct: "txn.Options", Field: "Versions", Reason: fmt.Sprintf(
		"is nil, but records that a deployment with Versions parked behind a version gap wait in its changelog (%s; the oldest since %s), "+
			"their input offsets committed: without Versions they are neither applied nor dead-lettered. Run with Versions as before until "+
			"none waits (a short GapTimeout sends them to the dead-letter topic), or delete the changelog topic to drop them",
		strings.Join(where, ", "), oldest.Format(time.RFC3339))}, nil, nil
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
