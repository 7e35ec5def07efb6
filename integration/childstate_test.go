package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/kscope-dev/kscope/consumer"
)

// stateLinePref starts the line a child prints on SIGUSR1: its runner's
// state, as JSON (childState).
const stateLinePref = "STATE "

// childRunner is the runner a child consumes with, for its state dump.
var childRunner atomic.Pointer[consumer.Runner]

// childState is what a child says of its runner when a test that failed
// asks (SIGUSR1, before SIGQUIT's stacks): its Stats; the partitions its
// client has paused; the committed offset of each partition its client
// knows; and, for the partitions polled past it, the offset after the last
// record a poll returned. A stalled partition then shows whether its
// records were never fetched (paused, or polled short of them) or were
// polled and not finished.
type childState struct {
	Stats     consumer.Stats             `json:"stats"`
	Paused    map[string][]int32         `json:"client_paused"`
	PolledTo  map[string]map[int32]int64 `json:"polled_to"`
	Committed map[string]map[int32]int64 `json:"committed"`
}

// watchState makes a child print its runner's state (stateLinePref) on
// each SIGUSR1, through say.
func watchState(say func(pref string, v []byte)) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		for range ch {
			say(stateLinePref, stateOf(childRunner.Load()))
		}
	}()
}

// stateOf returns r's state as JSON, or why there is none.
func stateOf(r *consumer.Runner) []byte {
	if r == nil {
		return []byte(`{"error":"no runner"}`)
	}
	st := childState{Stats: r.Stats()}
	if cl := r.Client(); cl != nil {
		st.Paused = cl.PauseFetchPartitions(nil)
		st.PolledTo = map[string]map[int32]int64{}
		for t, ps := range cl.UncommittedOffsets() {
			st.PolledTo[t] = map[int32]int64{}
			for p, o := range ps {
				st.PolledTo[t][p] = o.Offset
			}
		}
		st.Committed = map[string]map[int32]int64{}
		for t, ps := range cl.CommittedOffsets() {
			st.Committed[t] = map[int32]int64{}
			for p, o := range ps {
				st.Committed[t][p] = o.Offset
			}
		}
	}
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Appendf(nil, `{"error":%q}`, err.Error())
	}
	return b
}
