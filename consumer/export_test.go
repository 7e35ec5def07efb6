package consumer

import "context"

// AssignAgain calls r's onAssigned for partition p of topic, as franz-go's
// transactional session does for a partition revoked without the revoke
// being passed on (the session passes on one revoke or loss per
// transaction) and then assigned to this member again.
func AssignAgain(r *Runner, topic string, p int32) {
	r.onAssigned(context.Background(), r.cl, map[string][]int32{topic: {p}})
}
