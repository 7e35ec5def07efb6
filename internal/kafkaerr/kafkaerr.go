// Package kafkaerr classifies the errors a Kafka client reports, for every
// part of kscope that must tell an error that heals from one that does
// not: the runner's poll loop and its transactions' writes (package
// consumer) and the outbox relay's group client.
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

// Refused reports whether err is the broker's, or the client's, refusal of
// a record as such: too large, invalid, or for a topic whose name is
// invalid. Writing the same record again fails the same way. The broker
// refuses a whole batch for one bad record in it, and kgo does not split
// batches, so the other records of that batch fail with the same error.
func Refused(err error) bool {
	for _, e := range []error{
		kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord,
		kerr.InvalidTimestamp, kerr.CorruptMessage, kerr.InvalidTopicException,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
