package hook

import "time"

// Pause is what PauseHook receives when a pause of a runner's fetching
// (consumer.Runner.Pause, consumer.PauseFrom) begins or ends.
type Pause struct {
	Group  string
	Target string    // what it holds: "all", a topic's name, or topic[partition]
	Reason string    // why: "user" unless the pause named its reason
	Since  time.Time // when it began
	Paused bool      // true when it begins, false when it ends
}

// PauseHook is called when a pause begins and when it ends (see Pause).
type PauseHook interface {
	OnPause(p Pause)
}
