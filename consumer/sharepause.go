package consumer

// A share-group runner's pauses (Config.Share): a share group assigns no
// partitions to a member, so a pause names its topics and partitions to
// the client directly. The client then leaves them out of its fetches and
// releases, for another member, whatever it had fetched of them and not
// yet handed over.

// shareFetchPause pauses fetching of what t holds. r.pauseMu is held.
func (r *Runner) shareFetchPause(t Target) int {
	cl := r.Client()
	if cl == nil {
		return 0
	}
	switch t.kind {
	case targetAll:
		cl.PauseFetchTopics(r.topics()...)
		return len(r.topics())
	case targetTopic:
		cl.PauseFetchTopics(t.topic)
	case targetPartition:
		cl.PauseFetchPartitions(map[string][]int32{t.topic: {t.partition}})
	}
	return 1
}

// shareRepause makes the client's pauses those the runner holds: it
// resumes everything, then pauses again what a pause still holds, so that
// a resume of one target leaves another's pause of the same topic in
// force. r.pauseMu is held.
func (r *Runner) shareRepause() int {
	cl := r.Client()
	if cl == nil {
		return 0
	}
	paused := cl.PauseFetchPartitions(nil)
	topics := cl.PauseFetchTopics()
	cl.ResumeFetchTopics(topics...)
	cl.ResumeFetchPartitions(paused)
	for _, up := range r.pauseMu.user.list {
		r.shareFetchPause(up.Target)
	}
	return len(topics) + len(paused)
}

// shareApplyPauses applies the pauses made before the client existed, and
// those persisted (PersistPause), to a share group's new client.
func (r *Runner) shareApplyPauses() {
	r.loadStored()
	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	for _, up := range r.pauseMu.user.list {
		r.shareFetchPause(up.Target)
	}
	if n := len(r.pauseMu.user.list); n > 0 {
		r.log.Info("kscope: the share group's member starts paused", "pauses", n)
	}
}
