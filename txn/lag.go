package txn

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/engine"
)

// lagState keeps what the lag hooks need about the partitions of the open
// transaction: their high watermarks and the timestamp of their last
// record.
type lagState struct {
	on    bool
	fetch bool
	hwm   map[tp]int64
	last  map[tp]time.Time
}

func newLagState(obs engine.Observer) *lagState {
	return &lagState{on: obs.WantsLag(), fetch: obs.WantsFetch(), hwm: map[tp]int64{}, last: map[tp]time.Time{}}
}

func (l *lagState) fetched(obs engine.Observer, fs kgo.Fetches) {
	if !l.on && !l.fetch {
		return
	}
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		obs.Fetched(p.Topic, p.Partition, len(p.Records))
		k := tp{p.Topic, p.Partition}
		l.hwm[k] = p.HighWatermark
		l.last[k] = p.Records[len(p.Records)-1].Timestamp
	})
}

func (l *lagState) partitions() int { return len(l.hwm) }

// report reports, after a commit, each partition of the transaction: the
// records between its committed offset and its high watermark and, while
// there are some, the age of its last committed record, an upper bound of
// the age of the oldest unfinished one.
func (l *lagState) report(obs engine.Observer, cl *kgo.Client) {
	if !l.on || len(l.hwm) == 0 {
		return
	}
	committed := cl.CommittedOffsets()
	now := time.Now()
	for k, hwm := range l.hwm {
		eo, ok := committed[k.topic][k.partition]
		if !ok {
			continue
		}
		lg := consumer.Lag{Topic: k.topic, Partition: k.partition, Offsets: max(hwm-eo.Offset, 0)}
		if lg.Offsets > 0 {
			lg.Age = max(now.Sub(l.last[k]), 0)
		}
		obs.Lag(lg)
	}
}

func (l *lagState) reset() {
	clear(l.hwm)
	clear(l.last)
}
