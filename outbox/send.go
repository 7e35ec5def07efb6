package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// The Kafka transaction that publishes rows with the partition's position,
// and the partitioner that places the position.

// producerOpts are the options of a partition's transactional producer.
func (o Options) producerOpts(txnID string) []kgo.Opt {
	return append(append([]kgo.Opt{}, o.ClientOptions...),
		kgo.SeedBrokers(o.Brokers...),
		kgo.TransactionalID(txnID),
		kgo.TransactionTimeout(o.TransactionTimeout),
		kgo.RecordPartitioner(positionPartitioner{topic: o.PositionTopic, rest: kgo.StickyKeyPartitioner(nil)}),
		kgo.ProducerLinger(0),
	)
}

// errFenced says another producer with the partition's transactional id
// took over: this one must stop.
var errFenced = errors.New("fenced")

// send publishes rows and the partition's new position, last, in one
// Kafka transaction. When it does not commit, rowErrs holds the
// producer's answer for each row (nil for a row it took).
func (pub *publisher) send(ctx context.Context, cl *kgo.Client, rows []row, last int64) (rowErrs []error, err error) {
	r := pub.r
	if err := cl.BeginTransaction(); err != nil {
		return nil, err
	}
	var mu sync.Mutex
	rowErrs = make([]error, len(rows))
	var perr error // the first error, of a row or of the position
	note := func(i int) func(*kgo.Record, error) {
		return func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if i >= 0 {
					rowErrs[i] = err
				}
				if perr == nil {
					perr = err
				}
				mu.Unlock()
			}
		}
	}
	for i, w := range rows {
		hs, err := decodeHeaders(w.headers)
		if err != nil {
			// A row kscope did not write: published without headers
			// rather than never.
			r.log.Error("kscope: outbox relay: a row's headers cannot be decoded; publishing it without them", "partition", pub.p, "seq", w.seq, "err", err)
		}
		hs = append(hs, kgo.RecordHeader{Key: retrytopic.HeaderID, Value: []byte(pub.ident(w))})
		cl.Produce(ctx, &kgo.Record{Topic: w.topic, Key: w.key, Value: w.value, Headers: hs}, note(i))
	}
	cl.Produce(ctx, &kgo.Record{Topic: r.o.PositionTopic, Partition: int32(pub.p), Key: []byte(strconv.Itoa(pub.p)), Value: []byte(strconv.FormatInt(last, 10))}, note(-1))
	ferr := cl.Flush(ctx)
	if ferr != nil {
		// Stopped while flushing: nothing may stay buffered for the abort.
		_ = cl.AbortBufferedRecords(context.WithoutCancel(ctx))
	}
	mu.Lock()
	err = errors.Join(perr, ferr)
	rowErrs = slices.Clone(rowErrs)
	mu.Unlock()
	try := kgo.TryCommit
	if err != nil {
		try = kgo.TryAbort
	}
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.TransactionTimeout)
	eerr := cl.EndTransaction(endCtx, try)
	cancel()
	if fenced(err) || fenced(eerr) {
		return rowErrs, fmt.Errorf("%w: %v", errFenced, errors.Join(err, eerr))
	}
	if err == nil && eerr == nil {
		return nil, nil
	}
	if eerr != nil {
		// Make sure no transaction stays open before the next one.
		_ = cl.EndTransaction(context.WithoutCancel(ctx), kgo.TryAbort)
	}
	return rowErrs, errors.Join(err, eerr, errors.New("the transaction did not commit"))
}

func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
}

// positionPartitioner sends position records to the partition they name
// and every other record where rest would.
type positionPartitioner struct {
	topic string
	rest  kgo.Partitioner
}

func (p positionPartitioner) ForTopic(t string) kgo.TopicPartitioner {
	if t == p.topic {
		return kgo.ManualPartitioner().ForTopic(t)
	}
	return p.rest.ForTopic(t)
}
