// Package kafkaerr classifies the errors a Kafka client reports while it
// consumes or manages its group, for every part of kscope that consumes:
// the runner's poll loop (package consumer) and the outbox relay's group
// client.
package kafkaerr

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Fatal reports whether err cannot heal by retrying: the broker refuses
// this client the topic, the group or the cluster, or its credentials.
// Anything else (a coordinator moving, a broker restarting) the client
// retries by itself.
func Fatal(err error) bool {
	for _, e := range []error{
		kerr.TopicAuthorizationFailed, kerr.GroupAuthorizationFailed,
		kerr.ClusterAuthorizationFailed, kerr.SaslAuthenticationFailed,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
