package consumer

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
)

// Target names what a pause holds: every partition the runner consumes
// ([All]), every partition of one topic ([Topic]), or one partition
// ([Partition]). Build one with those functions: the zero Target names
// nothing, and Pause and Resume refuse it.
type Target struct {
	kind      targetKind
	topic     string
	partition int32
}

type targetKind uint8

const (
	targetNone targetKind = iota
	targetAll
	targetTopic
	targetPartition
)

// All is the target of every partition the runner consumes, the delay
// (retry) topics included: a pause of the whole runner.
func All() Target { return Target{kind: targetAll} }

// Topic is the target of every partition of topic, those assigned to this
// member now and those assigned to it later.
func Topic(name string) Target { return Target{kind: targetTopic, topic: name} }

// Partition is the target of one partition of topic.
func Partition(topic string, p int32) Target {
	return Target{kind: targetPartition, topic: topic, partition: p}
}

// String names the target: "all", the topic's name, or topic[partition].
func (t Target) String() string {
	switch t.kind {
	case targetAll:
		return "all"
	case targetTopic:
		return t.topic
	case targetPartition:
		return t.topic + "[" + strconv.Itoa(int(t.partition)) + "]"
	}
	return "none"
}

// holds reports whether t covers partition p of topic.
func (t Target) holds(topic string, p int32) bool {
	switch t.kind {
	case targetAll:
		return true
	case targetTopic:
		return t.topic == topic
	case targetPartition:
		return t.topic == topic && t.partition == p
	}
	return false
}

// within reports whether t lies within u: u holds everything t holds.
func (t Target) within(u Target) bool {
	switch u.kind {
	case targetAll:
		return true
	case targetTopic:
		return t.kind != targetAll && t.topic == u.topic
	}
	return t == u
}

// check says what is wrong with a target that names nothing.
func (t Target) check() error {
	switch {
	case t.kind == targetNone || t.kind > targetPartition:
		return errors.New("kscope: an empty pause target; build one with consumer.All, consumer.Topic or consumer.Partition")
	case t.kind != targetAll && t.topic == "":
		return fmt.Errorf("kscope: pause target %s names no topic; name the topic, or use consumer.All", t)
	case t.kind == targetPartition && t.partition < 0:
		return fmt.Errorf("kscope: pause target %s: partition %d; partitions count from 0", t, t.partition)
	}
	return nil
}

// PausedTarget is one pause in force: what it holds, since when, why, and
// until when.
type PausedTarget struct {
	Target Target
	Since  time.Time // when it began
	Until  time.Time // when it ends by itself ([PauseFor]); zero: at Resume
	Reason string    // [PauseReason]; "user" when none was given
	// Persisted says the pause is kept in the group's pause topic
	// ([PersistPause]): it holds across restarts.
	Persisted bool
}

// PauseOption refines a pause (Runner.Pause, PauseFrom) or the pauses a
// resume ends (Runner.Resume).
type PauseOption func(*pauseSpec)

type pauseSpec struct {
	reason  string
	d       time.Duration
	persist bool
}

// PauseFor ends the pause by itself after d, as Resume would (a circuit
// breaker's open state). A pause of the same target and reason given again
// moves its end. d <= 0: until Resume.
func PauseFor(d time.Duration) PauseOption { return func(s *pauseSpec) { s.d = d } }

// PauseReason says why: it shows in Stats.Paused, the log lines and the
// kscope_paused metric, and it keeps pauses apart: a target paused for
// two reasons is fetched again once both ended. Given to Runner.Resume,
// it ends only the pauses of that reason. Default "user".
func PauseReason(reason string) PauseOption { return func(s *pauseSpec) { s.reason = reason } }

// defaultPauseReason is the reason of a pause given none.
const defaultPauseReason = "user"

func specOf(opts []PauseOption) pauseSpec {
	var s pauseSpec
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	return s
}

// userPause is a pause in force, in the runner's list.
type userPause struct {
	PausedTarget
	timer *time.Timer // ends it (PauseFor); nil without an end
}

// pauseState serializes pausing and resuming (the client's paused set and
// the runner's flags cannot disagree), and holds the pauses in force.
type pauseState struct {
	sync.Mutex
	user userPauses
}

// userPauses are a runner's pauses in force, under Runner.pauseMu: they
// outlive assignments, so that a partition assigned to this member again
// is paused before it is fetched (onAssigned).
type userPauses struct {
	list   []*userPause
	loaded bool // the persisted ones were read (loadStored)
}

// holds reports whether a pause in force holds partition p of topic.
func (u *userPauses) holds(topic string, p int32) bool {
	for _, up := range u.list {
		if up.Target.holds(topic, p) {
			return true
		}
	}
	return false
}

// Pause stops fetching the partitions t holds, now and whenever they are
// assigned to this member again (a pause holds across rebalances), until
// [Runner.Resume] ends it, or [PauseFor]'s time passes. Records already
// polled of them (in flight: queued on their key-shards or running)
// finish and commit; nothing is dropped, and no record of them starts
// after it that was not polled before it. Other partitions go on. A
// partition is fetched once no pause (of any target or reason) and no
// engine hold (backpressure, a retry record not yet due) holds it.
//
// Pause may be called before Run (the pause applies from the first
// assignment), while it runs, and from a handler ([PauseFrom]). It logs
// the pause at INFO and shows it in Stats.Paused and to hook.PauseHook
// hooks (kscope_paused in kscopeprom). Pausing a target paused already
// for the same reason keeps its Since and takes the new end. A pause
// lives in the runner, and a new process starts without it, unless it was
// given [PersistPause]: then it is written to the group's pause topic
// before Pause returns (an error says it is in force but not persisted),
// and every member that starts reads it.
func (r *Runner) Pause(t Target, opts ...PauseOption) error {
	if err := t.check(); err != nil {
		return err
	}
	s := specOf(opts)
	if s.reason == "" {
		s.reason = defaultPauseReason
	}
	now := time.Now()
	r.pauseMu.Lock()
	up := r.pauseMu.user.find(t, s.reason)
	fresh := up == nil
	if fresh {
		up = &userPause{PausedTarget: PausedTarget{Target: t, Since: now, Reason: s.reason}}
		r.pauseMu.user.list = append(r.pauseMu.user.list, up)
	}
	if up.timer != nil {
		up.timer.Stop()
		up.timer = nil
	}
	up.Until = time.Time{}
	if s.d > 0 {
		up.Until = now.Add(s.d)
		up.timer = time.AfterFunc(s.d, func() { r.expire(up) })
	}
	if s.persist {
		up.Persisted = true
	}
	held := r.fetchPause(t)
	p := up.PausedTarget
	r.pauseMu.Unlock()
	if fresh {
		r.log.Info("kscope: paused fetching", "target", t.String(), "reason", s.reason, "until", untilAttr(p.Until), "persisted", p.Persisted, "partitions_now", held)
		r.observePause(p, true)
	}
	if s.persist {
		if err := r.store(p, true); err != nil {
			return fmt.Errorf("kscope: the pause of %s is in force in this runner but not persisted: %w", t, err)
		}
	}
	return nil
}

// Resume ends the pauses of t and of the targets within it (Resume(All())
// ends every pause; Resume(Topic(x)) those of x and of its partitions),
// of every reason, or only of the reason [PauseReason] names. A partition
// another pause still holds stays paused: Resume(Partition(x, 0)) leaves
// it paused while Topic(x) is. It logs each pause it ends at INFO, and
// writes the end of a persisted one to the pause topic. Of opts, only
// PauseReason counts.
func (r *Runner) Resume(t Target, opts ...PauseOption) error {
	if err := t.check(); err != nil {
		return err
	}
	s := specOf(opts)
	r.pauseMu.Lock()
	var ended []*userPause
	r.pauseMu.user.list = slices.DeleteFunc(r.pauseMu.user.list, func(up *userPause) bool {
		if !up.Target.within(t) || (s.reason != "" && up.Reason != s.reason) {
			return false
		}
		ended = append(ended, up)
		return true
	})
	for _, up := range ended {
		if up.timer != nil {
			up.timer.Stop()
		}
	}
	resumed := r.fetchResume(ended)
	r.pauseMu.Unlock()
	now := time.Now()
	var errs []error
	for _, up := range ended {
		r.log.Info("kscope: resumed fetching", "target", up.Target.String(), "reason", up.Reason, "paused_for", now.Sub(up.Since).Round(time.Millisecond), "partitions_resumed", resumed)
		r.observePause(up.PausedTarget, false)
		if up.Persisted {
			if err := r.store(up.PausedTarget, false); err != nil {
				errs = append(errs, fmt.Errorf("kscope: the pause of %s ended in this runner, but its end was not persisted: a member that starts will pause it again: %w", up.Target, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Paused returns the pauses in force, in the order they began.
func (r *Runner) Paused() []PausedTarget {
	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	if len(r.pauseMu.user.list) == 0 {
		return nil
	}
	out := make([]PausedTarget, len(r.pauseMu.user.list))
	for i, up := range r.pauseMu.user.list {
		out[i] = up.PausedTarget
	}
	return out
}

// expire ends up when its PauseFor time passed, unless it was ended or
// given again meanwhile.
func (r *Runner) expire(up *userPause) {
	r.pauseMu.Lock()
	current := slices.Contains(r.pauseMu.user.list, up) && !up.Until.IsZero() && !time.Now().Before(up.Until)
	r.pauseMu.Unlock()
	if current {
		r.Resume(up.Target, PauseReason(up.Reason)) //nolint:errcheck // a target that was accepted once
	}
}

func (u *userPauses) find(t Target, reason string) *userPause {
	for _, up := range u.list {
		if up.Target == t && up.Reason == reason {
			return up
		}
	}
	return nil
}

// fetchPause pauses fetching of the assigned partitions t holds, and
// returns how many it holds. r.pauseMu is held.
func (r *Runner) fetchPause(t Target) int {
	if r.share != nil {
		return r.shareFetchPause(t)
	}
	tps := make(map[string][]int32)
	n := 0
	for _, st := range r.assignedNow() {
		if t.holds(st.Topic, st.Partition) && !st.Revoked() {
			tps[st.Topic] = append(tps[st.Topic], st.Partition)
			n++
		}
	}
	if cl := r.Client(); n > 0 && cl != nil {
		cl.PauseFetchPartitions(tps)
	}
	return n
}

// fetchResume resumes fetching of the assigned partitions that the ended
// pauses held and that nothing holds any more (no pause, no engine hold),
// and returns how many. r.pauseMu is held.
func (r *Runner) fetchResume(ended []*userPause) int {
	if r.share != nil {
		return r.shareRepause()
	}
	tps := make(map[string][]int32)
	n := 0
	for _, st := range r.assignedNow() {
		was := slices.ContainsFunc(ended, func(up *userPause) bool { return up.Target.holds(st.Topic, st.Partition) })
		if was && !st.Revoked() && !st.paused.Load() && !st.holdPaused && !r.pauseMu.user.holds(st.Topic, st.Partition) {
			tps[st.Topic] = append(tps[st.Topic], st.Partition)
			n++
		}
	}
	if cl := r.Client(); n > 0 && cl != nil {
		cl.ResumeFetchPartitions(tps)
	}
	return n
}

// assignedNow returns the partitions assigned now.
func (r *Runner) assignedNow() []*partState {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*partState, 0, len(r.parts))
	for _, st := range r.parts {
		out = append(out, st)
	}
	return out
}

// pauseAssigned pauses fetching of the newly assigned partitions a pause
// holds: onAssigned calls it, before the client fetches their offsets, so
// that a paused partition assigned to this member again stays paused.
func (r *Runner) pauseAssigned(cl *kgo.Client, assigned map[string][]int32) {
	r.loadStored()
	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	tps := make(map[string][]int32)
	for topic, ps := range assigned {
		for _, p := range ps {
			if r.pauseMu.user.holds(topic, p) {
				tps[topic] = append(tps[topic], p)
			}
		}
	}
	if len(tps) > 0 && cl != nil {
		cl.PauseFetchPartitions(tps)
		r.log.Info("kscope: assigned partitions stay paused", "partitions", tps)
	}
}

// unpauseGone lifts the client's pause of a revoked or lost partition a
// pause holds: the client keeps a pause across rebalances, and the pause
// is applied again if the partition comes back (pauseAssigned).
func (r *Runner) unpauseGone(st *partState) {
	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	if cl := r.Client(); r.pauseMu.user.holds(st.Topic, st.Partition) && cl != nil {
		cl.ResumeFetchPartitions(map[string][]int32{st.Topic: {st.Partition}})
	}
}

// userPaused reports whether a user's pause holds st.
func (r *Runner) userPaused(st *partState) bool {
	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	return r.userHolds(st)
}

// userHolds reports whether a pause holds st. r.pauseMu is held.
func (r *Runner) userHolds(st *partState) bool { return r.pauseMu.user.holds(st.Topic, st.Partition) }

// observePause tells the hook.PauseHook hooks that p began (on) or ended.
func (r *Runner) observePause(p PausedTarget, on bool) {
	for _, h := range r.cfg.Hooks {
		if ph, ok := h.(hook.PauseHook); ok {
			ph.OnPause(hook.Pause{Group: r.cfg.Group, Target: p.Target.String(), Reason: p.Reason, Since: p.Since, Paused: on})
		}
	}
}

func untilAttr(t time.Time) string {
	if t.IsZero() {
		return "resume"
	}
	return t.UTC().Format(time.RFC3339Nano)
}
