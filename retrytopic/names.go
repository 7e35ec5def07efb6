package retrytopic

import (
	"strings"
	"time"
)

// DefaultLadder is the delay of each retry topic, in order.
var DefaultLadder = []time.Duration{5 * time.Second, time.Minute, 10 * time.Minute}

// RetryTopic returns the default name of group's retry topic for delay:
// "<group>.kscope-retry-<delay>", such as "payments.kscope-retry-5s". Retry
// topics are per consumer group, so another group reading the same source
// topic never sees this group's retries.
func RetryTopic(group string, delay time.Duration) string {
	return topicSafe(group) + ".kscope-retry-" + shortDuration(delay)
}

// RetryTopicDelay is the inverse of RetryTopic: it reports whether topic
// is one of group's retry topics, and its delay.
func RetryTopicDelay(group, topic string) (time.Duration, bool) {
	prefix := topicSafe(group) + ".kscope-retry-"
	if !strings.HasPrefix(topic, prefix) {
		return 0, false
	}
	d, err := time.ParseDuration(strings.TrimPrefix(topic, prefix))
	if err != nil || d <= 0 || RetryTopic(group, d) != topic {
		return 0, false
	}
	return d, true
}

// DLTopic returns the default name of group's dead-letter topic:
// "<group>.kscope-dlt".
func DLTopic(group string) string { return topicSafe(group) + ".kscope-dlt" }

// SafeName maps a name (a group id, an outbox name) to the characters a
// topic name allows, as the default topic names use it.
func SafeName(s string) string { return topicSafe(s) }

// topicSafe maps a group id to the characters a topic name allows.
func topicSafe(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 128 && (r == '.' || r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	out := b.String()
	if len(out) > 180 {
		out = out[:180]
	}
	return out
}

// shortDuration renders 5s, 1m, 10m, 1h30m, 250ms: Duration.String without
// its zero units.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
