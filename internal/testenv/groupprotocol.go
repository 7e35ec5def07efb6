package testenv

import "os"

// GroupProtocolEnv names the environment variable that selects the consumer
// group protocol of the tests' base configurations: "classic" or
// "consumer" (KIP-848). Empty selects the runner's default.
const GroupProtocolEnv = "KSCOPE_GROUP_PROTOCOL"

// GroupProtocol is the group protocol the tests' base configurations use:
// the value of KSCOPE_GROUP_PROTOCOL, empty for the runner's default.
func GroupProtocol() string { return os.Getenv(GroupProtocolEnv) }
