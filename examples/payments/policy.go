package main

import (
	_ "embed"
	"fmt"

	"github.com/kscope-dev/kscope/policy"
)

// policyFile is the payments service's policy: one entry per consumer
// group, read by the service at start and by the kscope CLI (kscope policy
// check examples/payments/kscope-policy.yaml).
//
//go:embed kscope-policy.yaml
var policyFile []byte

// policyName is what the policy's problems call it.
const policyName = "examples/payments/kscope-policy.yaml"

// servicePolicy reads and checks the service's policy.
func servicePolicy() (*policy.File, error) {
	return policy.Parse(policyName, policyFile)
}

// entry returns the policy of the consumer group the file calls name,
// for the run's group (its name with the run's suffix, devenv.RunName).
func entry(name, runGroup string) (policy.Consumer, error) {
	f, err := servicePolicy()
	if err != nil {
		return policy.Consumer{}, err
	}
	c, ok := f.Consumer(name)
	if !ok {
		return c, fmt.Errorf("%s has no entry for consumer group %s; add one", policyName, name)
	}
	c.Group = runGroup
	return c, nil
}

// checkPolicy checks the policy at the demo's start: it is valid, and it
// has an entry for each of the demo's consumer groups.
func checkPolicy() error {
	f, err := servicePolicy()
	if err != nil {
		return err
	}
	for _, name := range []string{"ledger", "notifications"} {
		c, ok := f.Consumer(name)
		if !ok {
			return fmt.Errorf("%s has no entry for consumer group %s; add one", policyName, name)
		}
		fmt.Printf("policy: %s (%s scope, owned by %s, replay %s, lag objective %s at p95)\n",
			name, c.Scope, c.Owner.Team, map[bool]string{true: "allowed", false: "refused"}[c.Replay], c.LagP95())
	}
	return nil
}
