package consumer

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/scope"
)

// gatedTxnScope is a transactional scope whose records of topic "t" finish
// only once open is closed; "d" is a delay topic.
type gatedTxnScope struct {
	txnStub
	open chan struct{}
	once sync.Once
	done sync.WaitGroup
}

func (s *gatedTxnScope) release() { s.once.Do(func() { close(s.open) }) }

func (s *gatedTxnScope) Process(_ context.Context, batch []*Record, done func(*Record)) {
	for _, r := range batch {
		if r.Topic == "t" {
			<-s.open
		}
		done(r)
		s.done.Done()
	}
}

var _ scope.Transactor[*Record] = (*gatedTxnScope)(nil) // the runner finds it by this interface

func (*gatedTxnScope) DelayedTopics() map[string]time.Duration {
	return map[string]time.Duration{"d": time.Hour}
}

// maxOffsetMetadata is the broker's default offset.metadata.max.bytes: a
// TxnOffsetCommit whose metadata is longer fails for that partition, and
// the transaction aborts.
const maxOffsetMetadata = 4096

// An input written by transactional producers (another Kafka-scope
// pipeline, the outbox relay, kscope's own retry topics) carries a marker
// after every transaction. A marker is counted done as it is polled; one
// that lies above records the runner holds back (past commit.MaxUndone
// dispatched, or not due yet on a retry topic) would make the transaction
// list every held record below it as undone in the offset's metadata:
// thousands of them, more than the broker takes, so that every
// transaction of the runner aborts, again after every rewind. A marker
// behind held records counts as done once they are dispatched, and the
// committed offset still passes it when they are done.
func TestTxnMetadataStaysWithinTheBrokersLimit(t *testing.T) {
	control := kgo.NewRecordAttrs(kgo.RecordAttrsOpts{Control: true, Transactional: true})
	cases := []struct {
		name  string
		topic string
		recs  func() []*kgo.Record // in offset order from 0
	}{
		{"a large input transaction, past the dispatch bound", "t", func() []*kgo.Record {
			recs := make([]*kgo.Record, 0, 4001)
			for i := range 4000 {
				recs = append(recs, &kgo.Record{Topic: "t", Offset: int64(i), Key: fmt.Appendf(nil, "k%d", i)})
			}
			return append(recs, &kgo.Record{Topic: "t", Offset: 4000, Attrs: control})
		}},
		{"retry-topic records waiting for their due time, one transaction each", "d", func() []*kgo.Record {
			due := []byte(strconv.FormatInt(time.Now().Add(30*time.Minute).UnixMilli(), 10))
			recs := make([]*kgo.Record, 0, 8000)
			for i := range 4000 {
				recs = append(recs,
					&kgo.Record{Topic: "d", Offset: int64(2 * i), Key: fmt.Appendf(nil, "k%d", i), Headers: []kgo.RecordHeader{{Key: HeaderDue, Value: due}}},
					&kgo.Record{Topic: "d", Offset: int64(2*i + 1), Attrs: control})
			}
			return recs
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sc := &gatedTxnScope{open: make(chan struct{})}
			r, cl := offlineRunner(t, []string{"t", "d"}, sc)
			defer sc.release() // before the pool stops: its workers wait for it
			ctx := context.Background()
			r.onAssigned(ctx, cl, map[string][]int32{c.topic: {0}})
			st := r.state(c.topic, 0)

			recs := c.recs()
			data := 0
			for _, rec := range recs {
				if !rec.Attrs.IsControl() {
					data++
				}
			}
			if c.topic == "t" {
				sc.done.Add(data)
			}
			r.dispatchAll(c.topic, 0, int64(len(recs)), recs)

			points := txnEngine{r}.Progress(func(string, int32) (commit.Done, bool) { return commit.Done{}, true })
			for _, pt := range points {
				if n, meta := len(pt.Done.Undone), pt.Done.Metadata(); n > commit.MaxUndone || len(meta) > maxOffsetMetadata {
					t.Fatalf("the transaction would commit %s[0] at %d with %d undone records listed in %d bytes of metadata; "+
						"the broker takes at most %d bytes, and at most %d records are dispatched and not done",
						c.topic, pt.Done.Offset, n, len(meta), maxOffsetMetadata, commit.MaxUndone)
				}
			}
			if c.topic == "d" {
				return // nothing is due: the records stay held
			}
			sc.release()
			sc.done.Wait()
			r.flushDone()
			last := recs[len(recs)-1].Offset
			testenv.WaitFor(t, 10*time.Second, "the marker counted done", func() bool {
				return st.Watermark.Progress(commit.Done{}).Offset == last+1
			})
			if got := st.Watermark.Progress(commit.Done{}); got.Metadata() != "" {
				t.Fatalf("every record done: progress %+v, want no metadata", got)
			}
		})
	}
}
