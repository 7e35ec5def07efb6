package consumer

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
)

// AssignAgain calls r's onAssigned for partition p of topic, as franz-go's
// transactional session does for a partition revoked without the revoke
// being passed on (the session passes on one revoke or loss per
// transaction) and then assigned to this member again. As the client does
// for a new assignment, it then fetches the partition from the group's
// committed offset (the start of the log when none): records fetched
// while the runner ended the earlier assignment, and dropped, are fetched
// again. (The client fetches a newly assigned partition only once
// onAssigned has returned; here the partition's fetches go on meanwhile.)
func AssignAgain(r *Runner, topic string, p int32) error {
	ctx := context.Background()
	r.onAssigned(ctx, r.cl, map[string][]int32{topic: {p}})
	adm := kadm.NewClient(r.cl)
	committed, err := adm.FetchOffsets(ctx, r.cfg.Group)
	if err != nil {
		return err
	}
	off := int64(-1)
	if o, ok := committed.Lookup(topic, p); ok && o.Err == nil {
		off = o.At
	}
	if off < 0 {
		starts, err := adm.ListStartOffsets(ctx, topic)
		if err != nil {
			return err
		}
		o, ok := starts.Lookup(topic, p)
		if !ok || o.Err != nil {
			return fmt.Errorf("no start offset of %s[%d]: %v", topic, p, o.Err)
		}
		off = o.Offset
	}
	r.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{topic: {p: {Epoch: -1, Offset: off}}})
	return nil
}

// Observer is the runner's hook dispatcher (scope.Observer and the
// runner's own events).
type Observer = observer

// NewObserver returns the Observer of group's hooks.
func NewObserver(group string, hooks []hook.Hook) *Observer { return newObserver(group, hooks) }

// DueOf reads the due time a delay-topic record carries.
var DueOf = dueOf
