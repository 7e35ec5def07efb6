package consumer

import (
	"context"

	"github.com/kscope-dev/kscope/hook"
)

// AssignAgain calls r's onAssigned for partition p of topic, as franz-go's
// transactional session does for a partition revoked without the revoke
// being passed on (the session passes on one revoke or loss per
// transaction) and then assigned to this member again.
func AssignAgain(r *Runner, topic string, p int32) {
	r.onAssigned(context.Background(), r.cl, map[string][]int32{topic: {p}})
}

// Observer is the runner's hook dispatcher (scope.Observer and the
// runner's own events).
type Observer = observer

// NewObserver returns the Observer of group's hooks.
func NewObserver(group string, hooks []hook.Hook) *Observer { return newObserver(group, hooks) }

// DueOf reads the due time a delay-topic record carries.
var DueOf = dueOf
