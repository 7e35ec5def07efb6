package testenv

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// kfake (at the version kscope tests with) never expires a classic-group
// member whose process died while its JoinGroup waited at the broker, when
// the group's leader syncs before the pending-sync deadline: the join's
// reply to the dead connection fails, and the session timer is armed only
// when a reply reaches the member (or by its own heartbeats). The member
// then keeps its partitions in a Stable group forever, and nobody consumes
// them. Apache Kafka schedules every member's session expiry when the join
// completes, so there the member goes after its session timeout.
//
// Departed makes the in-process cluster behave as Apache Kafka does: the
// test says which client died (a child process it SIGKILLed, whose client
// ID it knows), and a member of that client still in the group after
// reapAfter is removed, as its session expiry would have removed it.

// reapAfter is how long a departed client's member may stay: longer than
// the session timeout of the tests' child members (1 s), so that kfake's
// own expiry, when it works, comes first.
const reapAfter = 1500 * time.Millisecond

// reapFor is how long a departed client is watched: a JoinGroup it sent
// before it died completes at the latest at the group's rebalance
// timeout.
const reapFor = time.Minute

type departed struct {
	group, clientID string
	at              time.Time
}

type reaper struct {
	mu     sync.Mutex
	gone   []departed
	stop   chan struct{}
	done   chan struct{}
	closed bool
}

// Departed tells an in-process cluster that the client with this client ID,
// a member of group, is dead (its process was killed): a member it leaves
// in the group is removed once its session would have expired. It does
// nothing for the other backends, which expire such a member themselves.
func (k *Kafka) Departed(group, clientID string) {
	if k.Cluster == nil {
		return
	}
	r := &k.reap
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	if r.stop == nil {
		r.stop, r.done = make(chan struct{}), make(chan struct{})
		go k.reapLoop()
	}
	r.gone = append(r.gone, departed{group: group, clientID: clientID, at: time.Now()})
}

// stopReaping ends the reaper; Close calls it before the cluster stops.
func (k *Kafka) stopReaping() {
	r := &k.reap
	r.mu.Lock()
	r.closed = true
	stop, done := r.stop, r.done
	r.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}

func (k *Kafka) reapLoop() {
	r := &k.reap
	defer close(r.done)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		now := time.Now()
		r.mu.Lock()
		var due []departed
		kept := r.gone[:0]
		for _, d := range r.gone {
			if now.Sub(d.at) < reapFor {
				kept = append(kept, d)
			}
			if now.Sub(d.at) >= reapAfter {
				due = append(due, d)
			}
		}
		r.gone = kept
		r.mu.Unlock()
		for _, d := range due {
			k.reapMembers(d)
		}
	}
}

// reapMembers removes from d's group the members of d's client, by the
// LeaveGroup request a member sends when it leaves: kfake handles it as it
// handles an expired session (the member goes and the group rebalances).
func (k *Kafka) reapMembers(d departed) {
	info := k.Cluster.GroupInfo(d.group)
	if info == nil {
		return
	}
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = d.group
	for _, m := range info.Members {
		if m.ClientID == d.clientID {
			lm := kmsg.NewLeaveGroupRequestMember()
			lm.MemberID = m.MemberID
			req.Members = append(req.Members, lm)
		}
	}
	if len(req.Members) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req.RequestWith(ctx, k.admin()) // a failure is retried at the next tick
}
