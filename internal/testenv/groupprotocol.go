package testenv

import (
	"os"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// GroupProtocolEnv names the environment variable that selects the consumer
// group protocol of the tests' base configurations: "classic" or
// "consumer" (KIP-848). Empty selects the runner's default.
const GroupProtocolEnv = "KSCOPE_GROUP_PROTOCOL"

// GroupProtocol is the group protocol the tests' base configurations use:
// the value of KSCOPE_GROUP_PROTOCOL, empty for the runner's default.
func GroupProtocol() string { return os.Getenv(GroupProtocolEnv) }

// HeartbeatKey is the request a group member of the tests' base
// configurations heartbeats with: ConsumerGroupHeartbeat under the consumer
// protocol, Heartbeat under the classic one. A kfake fault on it answered
// UNKNOWN_MEMBER_ID fences the member, which loses its partitions.
func HeartbeatKey() kmsg.Key {
	if GroupProtocol() == "consumer" {
		return kmsg.ConsumerGroupHeartbeat
	}
	return kmsg.Heartbeat
}
