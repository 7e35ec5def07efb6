package retrytopic

import (
	"testing"
	"time"
)

func TestTopicNames(t *testing.T) {
	for d, want := range map[time.Duration]string{
		5 * time.Second: "pay.kscope-retry-5s", time.Minute: "pay.kscope-retry-1m", 10 * time.Minute: "pay.kscope-retry-10m",
		90 * time.Minute: "pay.kscope-retry-1h30m", time.Hour: "pay.kscope-retry-1h", 250 * time.Millisecond: "pay.kscope-retry-250ms",
		90 * time.Second: "pay.kscope-retry-1m30s",
	} {
		if got := RetryTopic("pay", d); got != want {
			t.Errorf("RetryTopic(%s) = %s, want %s", d, got, want)
		}
	}
	if got := DLTopic("team/pay ments"); got != "team_pay_ments.kscope-dlt" {
		t.Errorf("DLTopic = %s", got)
	}
}
