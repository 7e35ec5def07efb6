package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/retrytopic"
)

// workers are the publishers of the partitions a relay owns now.
type workers struct {
	r     *Relay
	mu    sync.Mutex
	run   map[int]*publisher
	wg    sync.WaitGroup
	fatal func() error
	err   error
	// failed is closed when a publisher failed for good (err), so that
	// Run returns at once.
	failed chan struct{}
}

func newWorkers(r *Relay) *workers {
	w := &workers{r: r, run: map[int]*publisher{}, failed: make(chan struct{})}
	w.fatal = func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.err
	}
	return w
}

// start starts publishing partition p.
func (w *workers) start(ctx context.Context, p int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.run[p] != nil {
		return
	}
	pctx, cancel := context.WithCancel(ctx)
	pub := &publisher{r: w.r, p: p, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	pub.pos.Store(-1)
	w.run[p] = pub
	w.r.wakeMu.Lock()
	w.r.wake[p] = pub.wake
	w.r.pubs[p] = pub
	w.r.wakeMu.Unlock()
	w.r.owned.Add(1)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(pub.done)
		if err := pub.publish(pctx); err != nil && pctx.Err() == nil {
			w.fail(err)
		}
	}()
}

// fail fails the relay with err, unless it failed already: Run returns
// the first error.
func (w *workers) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
		close(w.failed)
	}
}

// stop stops publishing partition p and waits until its open transaction
// ended.
func (w *workers) stop(p int) {
	w.mu.Lock()
	pub := w.run[p]
	delete(w.run, p)
	w.mu.Unlock()
	if pub == nil {
		return
	}
	pub.cancel()
	<-pub.done
	w.r.wakeMu.Lock()
	delete(w.r.wake, p)
	delete(w.r.pubs, p)
	w.r.wakeMu.Unlock()
	w.r.owned.Add(-1)
}

func (w *workers) stopAll() {
	w.mu.Lock()
	ps := make([]int, 0, len(w.run))
	for p := range w.run {
		ps = append(ps, p)
	}
	w.mu.Unlock()
	for _, p := range ps {
		w.stop(p)
	}
	w.wg.Wait()
}

// publisher publishes one outbox partition.
type publisher struct {
	r      *Relay
	p      int
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{}
	pos    atomic.Int64 // the position its last committed transaction published; -1 until read
}

// row is one outbox row.
type row struct {
	seq     int64
	topic   string
	key     []byte
	value   []byte
	headers []byte
}

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

// publish fences any earlier producer of the partition, reads its
// position, and publishes rows after it until ctx is done. A fenced
// producer stops: another relay owns the partition now.
func (pub *publisher) publish(ctx context.Context) error {
	log := pub.r.log.With("partition", pub.p)
	for attempt := 1; ; attempt++ {
		fenced, err := pub.publishWith(ctx, log)
		if !fenced || err != nil || ctx.Err() != nil {
			return err
		}
		// Another producer of the partition's transactional id fenced
		// this one, or the broker aborted a transaction that outlived
		// TransactionTimeout (it fences the producer too). While the
		// partition is still this relay's (a rebalance that gave it to
		// another relay cancels ctx first), a new producer takes it over
		// again: that fences the other producer in turn and reads the
		// position the committed transactions reached, so nothing is
		// published twice, and a timed-out transaction does not stop the
		// partition for good.
		pub.r.aborts.Add(1)
		d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
		log.Warn("kscope: outbox relay: this relay's producer was fenced (another relay with the same transactional id, or a transaction that outlived TransactionTimeout); taking the partition over again with a new producer",
			"retry_in", d)
		if !backoff.Sleep(ctx, d) {
			return nil
		}
	}
}

// publishWith publishes the partition with a producer of its own until ctx
// ends, an error that retrying cannot heal, or the producer is fenced
// (fenced is then true).
func (pub *publisher) publishWith(ctx context.Context, log *slog.Logger) (fenced bool, err error) {
	r := pub.r
	txnID := r.o.TransactionalID + "-" + strconv.Itoa(pub.p)
	opts := r.o.producerOpts(txnID)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return false, fmt.Errorf("kscope: outbox relay: creating the producer of partition %d: %w", pub.p, err)
	}
	defer cl.Close()
	pos, ok := pub.takeOver(ctx, cl, log)
	if !ok {
		return false, nil
	}
	pub.pos.Store(pos)
	log.Info("kscope: outbox relay: publishing partition", "position", pos, "transactional_id", txnID)
	poll := time.NewTimer(0)
	defer poll.Stop()
	for attempt := 0; ctx.Err() == nil; {
		rows, err := pub.read(ctx, pos)
		if err != nil {
			if ctx.Err() != nil {
				return false, nil
			}
			attempt++
			d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
			log.Warn("kscope: outbox relay: reading the outbox failed; retrying", "err", err, "retry_in", d)
			if !backoff.Sleep(ctx, d) {
				return false, nil
			}
			continue
		}
		if len(rows) == 0 {
			if !pub.idle(ctx, pos, poll) {
				return false, nil
			}
			continue
		}
		last, err := pub.send(ctx, cl, rows)
		switch {
		case errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
			return false, fmt.Errorf("kscope: outbox relay: the broker refused this relay its transactional id %s "+
				"(grant this client Write and Describe on it, then start the relay again): %w", txnID, err)
		case errors.Is(err, errFenced):
			log.Warn("kscope: outbox relay: the producer was fenced", "err", err)
			return true, nil
		case err != nil:
			if ctx.Err() != nil {
				return false, nil
			}
			r.aborts.Add(1)
			attempt++
			d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
			log.Warn("kscope: outbox relay: the transaction did not commit, or its end was not confirmed; publishing again from the partition's committed position", "err", err, "retry_in", d)
			if !backoff.Sleep(ctx, d) {
				return false, nil
			}
			// A commit the broker applied without the relay hearing it
			// (the answer lost, or later than the relay waited) moved the
			// position: read it again rather than publish its rows twice.
			if pos, ok = pub.takeOver(ctx, cl, log); !ok {
				return false, nil
			}
			pub.pos.Store(pos)
			continue
		}
		attempt = 0
		pos = last
		pub.pos.Store(pos)
		r.published.Add(int64(len(rows)))
		r.transactions.Add(1)
		pub.prune(ctx, pos)
	}
	return false, nil
}

// takeOver starts publishing the partition (start), retrying with backoff
// until it succeeds or ctx ends (then ok is false).
func (pub *publisher) takeOver(ctx context.Context, cl *kgo.Client, log *slog.Logger) (pos int64, ok bool) {
	for attempt := 1; ; attempt++ {
		pos, err := pub.start(ctx, cl)
		if err == nil {
			return pos, true
		}
		if ctx.Err() != nil {
			return 0, false
		}
		d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
		log.Warn("kscope: outbox relay: taking the partition over failed; retrying", "err", err, "retry_in", d)
		if !backoff.Sleep(ctx, d) {
			return 0, false
		}
	}
}

// start fences every earlier producer of the partition (aborting its open
// transaction) and reads the partition's position: the last sequence
// number a committed transaction published.
func (pub *publisher) start(ctx context.Context, cl *kgo.Client) (int64, error) {
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return 0, fmt.Errorf("initialising the producer: %w", err)
	}
	pos, err := readPositions(ctx, pub.r.o, []int{pub.p})
	if err != nil {
		return 0, err
	}
	return pos[pub.p], nil
}

// read returns the partition's rows after pos, in sequence order, at most
// BatchSize of them.
func (pub *publisher) read(ctx context.Context, pos int64) ([]row, error) {
	r := pub.r
	rows, err := r.o.Pool.Query(ctx, `SELECT seq, topic, key, value, headers FROM `+r.o.TablePrefix+`outbox
		WHERE outbox = $1 AND partition = $2 AND seq > $3 ORDER BY seq LIMIT $4`, r.o.Outbox, int32(pub.p), pos, r.o.BatchSize)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(rs pgx.CollectableRow) (row, error) {
		var w row
		err := rs.Scan(&w.seq, &w.topic, &w.key, &w.value, &w.headers)
		return w, err
	})
}

// send publishes rows and the partition's new position in one Kafka
// transaction and returns the position.
func (pub *publisher) send(ctx context.Context, cl *kgo.Client, rows []row) (int64, error) {
	r := pub.r
	if err := cl.BeginTransaction(); err != nil {
		return 0, err
	}
	var mu sync.Mutex
	var perr error
	note := func(_ *kgo.Record, err error) {
		if err != nil {
			mu.Lock()
			if perr == nil {
				perr = err
			}
			mu.Unlock()
		}
	}
	for _, w := range rows {
		hs, err := decodeHeaders(w.headers)
		if err != nil {
			// A row kscope did not write: published without headers
			// rather than never.
			r.log.Error("kscope: outbox relay: a row's headers cannot be decoded; publishing it without them", "partition", pub.p, "seq", w.seq, "err", err)
		}
		id := r.o.Outbox + "/" + strconv.Itoa(pub.p) + "/" + strconv.FormatInt(w.seq, 10)
		hs = append(hs, kgo.RecordHeader{Key: retrytopic.HeaderID, Value: []byte(id)})
		cl.Produce(ctx, &kgo.Record{Topic: w.topic, Key: w.key, Value: w.value, Headers: hs}, note)
	}
	last := rows[len(rows)-1].seq
	cl.Produce(ctx, &kgo.Record{Topic: r.o.PositionTopic, Partition: int32(pub.p), Key: []byte(strconv.Itoa(pub.p)), Value: []byte(strconv.FormatInt(last, 10))}, note)
	ferr := cl.Flush(ctx)
	if ferr != nil {
		// Stopped while flushing: nothing may stay buffered for the abort.
		_ = cl.AbortBufferedRecords(context.WithoutCancel(ctx))
	}
	mu.Lock()
	err := errors.Join(perr, ferr)
	mu.Unlock()
	try := kgo.TryCommit
	if err != nil {
		try = kgo.TryAbort
	}
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.TransactionTimeout)
	eerr := cl.EndTransaction(endCtx, try)
	cancel()
	if fenced(err) || fenced(eerr) {
		return 0, fmt.Errorf("%w: %v", errFenced, errors.Join(err, eerr))
	}
	if err == nil && eerr == nil {
		return last, nil
	}
	if eerr != nil {
		// Make sure no transaction stays open before the next one.
		_ = cl.EndTransaction(context.WithoutCancel(ctx), kgo.TryAbort)
	}
	return 0, errors.Join(err, eerr, errors.New("the transaction did not commit"))
}

func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
}

// idle waits, with nothing after the position pos, until a writer's commit
// wakes the publisher or the poll interval passes. First it checks that the
// database has handed pos out at all; when it has not, it halts the
// partition until ctx ends and reports false.
func (pub *publisher) idle(ctx context.Context, pos int64, poll *time.Timer) bool {
	if ahead, err := pub.ahead(ctx, pos); err == nil && ahead {
		pub.halt(ctx, pos)
		return false
	}
	poll.Reset(pub.r.o.PollInterval)
	select {
	case <-ctx.Done():
	case <-pub.wake:
	case <-poll.C:
	}
	return true
}

// ahead reports whether pos, the position the partition's position topic
// holds, is past the last sequence number the database handed out for the
// partition: the outbox tables were recreated (a new database, a forgotten
// migration run again on an empty one) or restored from a backup, or the
// relay reads another database than its writers. Publishing on would skip
// the rows numbered up to pos, and pruning would delete them unpublished.
func (pub *publisher) ahead(ctx context.Context, pos int64) (bool, error) {
	r := pub.r
	var handed int64
	err := r.o.Pool.QueryRow(ctx, `SELECT coalesce(max(next_seq) - 1, 0) FROM `+r.o.TablePrefix+`outbox_sequences
		WHERE outbox = $1 AND partition = $2`, r.o.Outbox, int32(pub.p)).Scan(&handed)
	return err == nil && pos > handed, err
}

// halt stops publishing the partition whose position is ahead of the
// database, and says so until ctx ends (the relay stops or loses the
// partition): it publishes and deletes nothing of the partition, so the
// rows the database holds stay there for the operator.
func (pub *publisher) halt(ctx context.Context, pos int64) {
	r := pub.r
	r.halted.Add(1)
	defer r.halted.Add(-1)
	msg := "kscope: outbox relay: the position topic says this partition is published up to a sequence number the database has not handed out: " +
		"the outbox tables were recreated or restored, or the relay reads another database than the writers. " +
		"Nothing of the partition is published or deleted until this is resolved: publishing on would skip, and delete, the rows numbered up to the position. " +
		"Stop the relays, compare the outbox table with what consumers of the topic saw, then either delete the position topic (the relay publishes every row the table holds) " +
		"or raise the partition's next_seq above the position (rows numbered up to it are never published), and start the relays again"
	attrs := []any{"outbox", r.o.Outbox, "partition", pub.p, "position", pos, "position_topic", r.o.PositionTopic}
	r.log.Error(msg, attrs...)
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.log.Error(msg, attrs...)
		}
	}
}

// prune deletes the rows the position has passed; a failure is retried
// with the next transaction's.
func (pub *publisher) prune(ctx context.Context, pos int64) {
	r := pub.r
	if _, err := r.o.Pool.Exec(ctx, `DELETE FROM `+r.o.TablePrefix+`outbox WHERE outbox = $1 AND partition = $2 AND seq <= $3`,
		r.o.Outbox, int32(pub.p), pos); err != nil && ctx.Err() == nil {
		r.log.Warn("kscope: outbox relay: deleting published rows failed; retried after the next transaction", "partition", pub.p, "err", err)
	}
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
