package dbscope

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/retrytopic"
)

// The busy-key lookup takes each topic of a batch once and every keyed
// record's key; of a batch of several topics, only the pairs the batch
// holds are busy for it.
func TestBusyKeysOfABatchOfSeveralTopics(t *testing.T) {
	var work []*consumer.Record
	var metas []retrytopic.Metadata
	for _, r := range []struct{ topic, key string }{{"orders", "k1"}, {"refunds", "k2"}, {"orders", "k3"}, {"orders", ""}} {
		var key []byte
		if r.key != "" {
			key = []byte(r.key)
		}
		work = append(work, &consumer.Record{Record: &kgo.Record{Topic: "g.kscope-retry-5s", Key: key}})
		metas = append(metas, retrytopic.Metadata{OriginalTopic: r.topic})
	}
	topics, keys := parkedKeys(work, metas)
	if len(topics) != 2 || topics[0] != "orders" || topics[1] != "refunds" {
		t.Fatalf("topics %q, want [orders refunds]", topics)
	}
	if len(keys) != 3 {
		t.Fatalf("%d keys, want the 3 keyed records'", len(keys))
	}
	for _, c := range []struct {
		topic, key string
		want       bool
	}{{"orders", "k1", true}, {"refunds", "k2", true}, {"orders", "k3", true}, {"orders", "k2", false}, {"refunds", "k1", false}} {
		if got := busyPair(work, metas, c.topic, []byte(c.key)); got != c.want {
			t.Errorf("busyPair(%s, %s) = %v, want %v", c.topic, c.key, got, c.want)
		}
	}
}
