package consumer

// The consumer group protocol (Config.GroupProtocol) and static membership
// (Config.InstanceID): their client options, their validation, and how the
// runner learns the protocol its client actually uses.

import (
	"regexp"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// GroupProtocol is a consumer group protocol (Config.GroupProtocol).
type GroupProtocol string

// The consumer group protocols.
const (
	// GroupProtocolClassic is the classic protocol: the members join and
	// sync, and one of them assigns the partitions (kscope's default
	// balancer is cooperative-sticky, which revokes only the partitions
	// that move). Every Kafka version.
	GroupProtocolClassic GroupProtocol = "classic"
	// GroupProtocolConsumer is the consumer protocol of KIP-848: the
	// broker assigns the partitions, and each member reconciles its own
	// assignment through its heartbeats, with no group-wide barrier.
	// Kafka 4.0+; franz-go recommends Kafka 4.3+.
	GroupProtocolConsumer GroupProtocol = "consumer"
)

// instanceIDPattern is what Kafka accepts as a group.instance.id.
var instanceIDPattern = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// validateGroupMembership checks GroupProtocol and InstanceID.
func (c Config) validateGroupMembership(bad func(field, format string, args ...any)) {
	switch c.GroupProtocol {
	case GroupProtocolClassic, GroupProtocolConsumer, "":
	default:
		bad("GroupProtocol", "is %q; set it to consumer.GroupProtocolClassic (\"classic\") or consumer.GroupProtocolConsumer (\"consumer\"), or leave it empty for classic", c.GroupProtocol)
	}
	if c.InstanceID != "" && !instanceIDPattern.MatchString(c.InstanceID) {
		bad("InstanceID", "is %q; use at most 249 characters of letters, digits, '.', '_' and '-' (a StatefulSet's pod name fits)", c.InstanceID)
	}
	if c.Share == nil {
		return
	}
	if c.GroupProtocol == GroupProtocolConsumer {
		bad("GroupProtocol", "is consumer, but Share is set: a share group has its own protocol; leave GroupProtocol empty")
	}
	if c.InstanceID != "" {
		bad("InstanceID", "is set, but Share is set: a share group has no static members; leave InstanceID empty")
	}
}

// groupProtocolOptions are the client options of the configured protocol
// and instance id, which the runner sets after the user's. The runner's
// default balancer, cooperative-sticky, serves both protocols: under the
// consumer protocol it asks the broker for its uniform (sticky) assignor.
func (c Config) groupProtocolOptions() []kgo.Opt {
	var opts []kgo.Opt
	if c.GroupProtocol == GroupProtocolConsumer {
		opts = append(opts, kgo.ServerSideBalancer())
	}
	if c.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(c.InstanceID))
	}
	return opts
}

// protocolSeen learns the group protocol a client uses from the requests it
// writes: a ConsumerGroupHeartbeat is the consumer protocol's, a JoinGroup
// the classic one's (franz-go does not say which one it chose, and chooses
// classic when the broker lacks the consumer protocol).
type protocolSeen struct {
	used atomic.Pointer[GroupProtocol]
}

var _ kgo.HookBrokerWrite = (*protocolSeen)(nil)

// OnBrokerWrite implements kgo.HookBrokerWrite.
func (p *protocolSeen) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err != nil {
		return
	}
	var gp GroupProtocol
	switch kmsg.Key(key) {
	case kmsg.ConsumerGroupHeartbeat:
		gp = GroupProtocolConsumer
	case kmsg.JoinGroup:
		gp = GroupProtocolClassic
	default:
		return
	}
	if cur := p.used.Load(); cur == nil || *cur != gp {
		p.used.Store(&gp)
	}
}

// get is the protocol seen last, empty before the client's first join.
func (p *protocolSeen) get() GroupProtocol {
	if gp := p.used.Load(); gp != nil {
		return *gp
	}
	return ""
}

// logJoin logs the member's first assignment of a client: the protocol in
// use, the one asked for, and the instance id; a warning when the client
// fell back to the classic protocol.
func (r *Runner) logJoin() {
	used := r.proto.get()
	args := []any{"protocol", string(used), "asked", string(r.cfg.GroupProtocol)}
	if r.cfg.InstanceID != "" {
		args = append(args, "instance_id", r.cfg.InstanceID)
	}
	if used != "" && used != r.cfg.GroupProtocol {
		r.log.Warn("kscope: joined the group with another protocol than Config.GroupProtocol asked for: the broker lacks the consumer protocol (Kafka 4.0+, with group.coordinator.rebalance.protocols including consumer) or ClientOptions' kgo.Balancers puts neither a range nor a sticky balancer first", args...)
		return
	}
	r.log.Info("kscope: joined the group", args...)
}
