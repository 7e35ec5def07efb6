package consumer

import (
	"log/slog"
	"sync"
	"time"

	"github.com/kscope-dev/kscope/hook"
)

// HoldStats say whether key-shards hold their records because the
// deployment is wrong, in [Stats].Hold: a scope's round of work failed on
// an error that is not the record's fault (in the DB scope, a PostgreSQL
// error of dbscope.IsDeploymentError: a missing table or column, a
// refused privilege or login). A holding key-shard routes nothing to the
// retry topics or the dead-letter topic for it and commits no offset past
// its records; it retries with a backoff that grows to 30 s, and goes on
// by itself once the deployment is fixed. Key-shards that do not meet the
// error go on meanwhile.
type HoldStats struct {
	Shards int       // key-shards holding now
	Since  time.Time // when the current hold began (Shards went from 0 to 1); zero when none holds
	Err    string    // the error that began the current hold; empty when none holds
	Holds  int64     // holds begun since the runner was built
}

// deploymentHold tracks the key-shards held by a deployment error
// (Round.Held) across a runner's retry loops, and logs and reports each
// change between holding and not holding once.
type deploymentHold struct {
	mu     sync.Mutex
	shards int
	since  time.Time
	err    error
	holds  int64
}

// enter counts one more key-shard held by err.
func (h *deploymentHold) enter(f *failures, err error) {
	h.mu.Lock()
	h.shards++
	n := h.shards
	if n == 1 {
		h.since, h.err = time.Now(), err
		h.holds++
		f.log.Error("kscope: the pipeline holds: its work failed because the deployment is wrong, not the record "+
			"(a missing table or column, a refused privilege or login, a store that cannot be written); no record is sent to a retry topic or the dead-letter topic for it, "+
			"and the key-shards that meet it retry with backoff until it is fixed (run the service's migration, grant the privilege, mend the store)",
			slog.String("reason", "deployment"), slog.Any("err", err))
	}
	// Under the lock: the hooks see the counts in the order they changed.
	f.obs.Hold(hook.Hold{Reason: "deployment", Shards: n, Err: h.err})
	h.mu.Unlock()
}

// leave counts one key-shard less held: its work succeeded (resumed), or
// its loop ended (the runner stops, or the partition was revoked).
func (h *deploymentHold) leave(f *failures, resumed bool) {
	h.mu.Lock()
	h.shards--
	n := h.shards
	if n == 0 {
		msg := "kscope: the pipeline resumed: the work that held it succeeds"
		if !resumed {
			msg = "kscope: the pipeline no longer holds: the key-shards that held stopped (the runner stops, or their partitions were revoked)"
		}
		f.log.Info(msg, slog.String("reason", "deployment"),
			slog.Duration("held_for", time.Since(h.since).Round(time.Millisecond)), slog.Any("err", h.err))
		h.since, h.err = time.Time{}, nil
	}
	f.obs.Hold(hook.Hold{Reason: "deployment", Shards: n, Err: h.err})
	h.mu.Unlock()
}

func (h *deploymentHold) stats() HoldStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := HoldStats{Shards: h.shards, Since: h.since, Holds: h.holds}
	if h.err != nil {
		st.Err = h.err.Error()
	}
	return st
}
