package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A member whose process dies while its JoinGroup waits at the broker, in a
// group whose leader then syncs and gives it partitions, leaves the group
// once Departed names its client: the live member ends with every
// partition, as on Apache Kafka after the dead member's session timeout.
// The members speak the group protocol directly, so that the leader and
// the assignment are the test's.
func TestDepartedRemovesAMemberKilledInItsJoin(t *testing.T) {
	if kind, _ := KafkaKind(); kind != "kfake" {
		t.Skipf("Departed works around the in-process cluster; the backend is %s", kind)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := KafkaT(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	const topic, group = "t", "g-reap"
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	live := &rawMember{t: t, k: k, group: group, topic: topic, clientID: "live", sessionMs: 1000}
	// The dead member's session is 20 s: the test asks for it to be gone
	// well before, so that it passes only by Departed, whether or not the
	// join's reply reached the dead connection (when it does, kfake
	// expires the member after its session).
	dead := &rawMember{t: t, k: k, group: group, topic: topic, clientID: "dead", sessionMs: 20000}
	defer live.close()

	// The live member leads a group of its own.
	if leader := live.join(ctx); leader != live.id {
		t.Fatalf("the only member is not the leader")
	}
	live.sync(ctx, map[string][]int32{live.id: {0, 1, 2, 3}})
	// The dead member's JoinGroup waits for the leader to join again;
	// its process dies meanwhile.
	waiting := make(chan struct{})
	go func() {
		defer close(waiting)
		dead.join(ctx) // fails once the client is closed
	}()
	if _, err := k.Cluster.WaitGroupInfo(ctx, group, func(g *kfake.GroupInfo) bool { return len(g.Members) == 2 }); err != nil {
		t.Fatal(err)
	}
	dead.close()
	<-waiting
	// The leader joins again and gives the dead member half.
	if leader := live.join(ctx); leader != live.id {
		t.Fatalf("the leader changed")
	}
	live.sync(ctx, map[string][]int32{live.id: {0, 1}, dead.id: {2, 3}})
	k.Departed(group, "dead")
	gone := time.Now().Add(8 * time.Second)

	// The live member heartbeats, and joins again when told to, taking
	// every partition.
	for {
		info := k.Cluster.GroupInfo(group)
		if info.State == "Stable" && len(info.Members) == 1 && info.Members[0].ClientID == "live" && info.NumAssigned() == 4 {
			return
		}
		if live.heartbeat(ctx) == kerr.RebalanceInProgress {
			live.join(ctx)
			live.sync(ctx, map[string][]int32{live.id: {0, 1, 2, 3}})
		}
		if time.Now().After(gone) {
			t.Fatalf("the dead member is still in the group 8 s after Departed: %+v", info)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// rawMember is a classic-group member that sends JoinGroup, SyncGroup and
// Heartbeat requests itself.
type rawMember struct {
	t                      *testing.T
	k                      *Kafka
	group, topic, clientID string
	sessionMs              int32
	cl                     *kgo.Client
	id                     string
	gen                    int32
}

func (m *rawMember) client() *kgo.Client {
	if m.cl == nil {
		cl, err := kgo.NewClient(kgo.SeedBrokers(m.k.Brokers...), kgo.ClientID(m.clientID))
		if err != nil {
			m.t.Fatal(err)
		}
		m.cl = cl
	}
	return m.cl
}

func (m *rawMember) close() {
	if m.cl != nil {
		m.cl.Close()
	}
}

// join joins (or joins again) and returns the leader's member ID; on an
// error it returns "".
func (m *rawMember) join(ctx context.Context) string {
	cl := m.client()
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group, req.SessionTimeoutMillis, req.RebalanceTimeoutMillis = m.group, m.sessionMs, 5000
	req.ProtocolType = "consumer"
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{m.topic}
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name, p.Metadata = "range", meta.AppendTo(nil)
	req.Protocols = append(req.Protocols, p)
	for {
		req.MemberID = m.id
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return ""
		}
		err = kerr.ErrorForCode(resp.ErrorCode)
		m.id = resp.MemberID
		switch err {
		case nil:
			m.gen = resp.Generation
			return resp.LeaderID
		case kerr.MemberIDRequired:
			continue
		default:
			m.t.Errorf("%s: JoinGroup: %v", m.clientID, err)
			return ""
		}
	}
}

// sync sends the leader's SyncGroup with the given assignment.
func (m *rawMember) sync(ctx context.Context, plan map[string][]int32) {
	req := kmsg.NewPtrSyncGroupRequest()
	req.Group, req.Generation, req.MemberID = m.group, m.gen, m.id
	req.ProtocolType, req.Protocol = kmsg.StringPtr("consumer"), kmsg.StringPtr("range")
	for id, ps := range plan {
		a := kmsg.NewConsumerMemberAssignment()
		at := kmsg.NewConsumerMemberAssignmentTopic()
		at.Topic, at.Partitions = m.topic, ps
		a.Topics = append(a.Topics, at)
		ga := kmsg.NewSyncGroupRequestGroupAssignment()
		ga.MemberID, ga.MemberAssignment = id, a.AppendTo(nil)
		req.GroupAssignment = append(req.GroupAssignment, ga)
	}
	resp, err := req.RequestWith(ctx, m.client())
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		m.t.Fatalf("%s: SyncGroup: %v", m.clientID, err)
	}
}

// heartbeat sends one heartbeat and returns the broker's error.
func (m *rawMember) heartbeat(ctx context.Context) error {
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group, req.Generation, req.MemberID = m.group, m.gen, m.id
	resp, err := req.RequestWith(ctx, m.client())
	if err != nil {
		return err
	}
	return kerr.ErrorForCode(resp.ErrorCode)
}
