package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/backoff"
)

// The publish loop of one partition: the publisher, the producer it
// publishes with, and taking the partition over again when that producer
// cannot go on.

// publisher publishes one outbox partition.
type publisher struct {
	r      *Relay
	p      int
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{}
	pos    atomic.Int64 // the position its last committed transaction published; -1 until read
	stuck  atomic.Bool  // its last transaction failed for a reason an operator must fix

	// The rest is the publishing goroutine's alone.

	// probe bounds the rows of the next transaction while a record Kafka
	// refused is searched for (0: BatchSize). It halves with each refused
	// transaction and doubles with each committed one.
	probe int
	// lone is the row at the head of the partition that Kafka refused
	// when it was sent alone, and how many times in a row; once that
	// reaches refusalsToDeadLetter, doomed holds it and why.
	lone struct {
		seq int64
		n   int
	}
	doomed *refusal
	// stuckAt is the row that made the partition stuck: a transaction
	// that commits it ends the stuck state.
	stuckAt int64
	// Rate limits of the ERROR lines.
	deadLog, stuckLog, misplacedLog throttle
	// checkedTo is the last row checked for its partition (misplaced).
	checkedTo int64
}

// publish fences any earlier producer of the partition, reads its
// position, and publishes rows after it until ctx is done. A fenced
// producer stops: another relay owns the partition now.
func (pub *publisher) publish(ctx context.Context) error {
	log := pub.r.log.With("partition", pub.p)
	defer pub.setStuck(false) // the partition is no longer this relay's to report
	for attempt := 1; ; attempt++ {
		renew, err := pub.publishWith(ctx, log)
		if renew == nil || err != nil || ctx.Err() != nil {
			return err
		}
		// Another producer of the partition's transactional id fenced
		// this one, or the broker aborted a transaction that outlived
		// TransactionTimeout (it fences the producer too), or ended one
		// with an answer that leaves the producer failed for good. While
		// the partition is still this relay's (a rebalance that gave it
		// to another relay cancels ctx first), a new producer takes it
		// over again: that fences the other producer in turn and reads
		// the position the committed transactions reached, so nothing is
		// published twice, and the partition does not stop for good.
		d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
		if errors.Is(renew, errFenced) {
			pub.r.aborts.Add(1)
			log.Warn("kscope: outbox relay: this relay's producer was fenced (another relay with the same transactional id, or a transaction that outlived TransactionTimeout); taking the partition over again with a new producer",
				"retry_in", d)
		} else {
			log.Warn("kscope: outbox relay: this relay's producer cannot go on after its transaction failed; taking the partition over again with a new producer",
				"err", renew, "retry_in", d)
		}
		if !backoff.Sleep(ctx, d) {
			return nil
		}
	}
}

// publishWith publishes the partition with a producer of its own until ctx
// ends, an error that retrying cannot heal, or the producer cannot go on
// (renew then says why: fenced, or failed for good), when a new producer
// must take the partition over.
func (pub *publisher) publishWith(ctx context.Context, log *slog.Logger) (renew, err error) {
	r := pub.r
	txnID := r.o.TransactionalID + "-" + strconv.Itoa(pub.p)
	opts := r.o.producerOpts(txnID)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kscope: outbox relay: creating the producer of partition %d: %w", pub.p, err)
	}
	defer cl.Close()
	pos, ok, err := pub.takeOver(ctx, cl, log)
	if !ok {
		return nil, err
	}
	pub.tookOver(ctx, pos)
	log.Info("kscope: outbox relay: publishing partition", "position", pos, "transactional_id", txnID)
	tp := &txnProducer{cl: cl, txnID: txnID, log: log, pos: pos}
	tp.maxBytes, _ = cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
	poll := time.NewTimer(0)
	defer poll.Stop()
	// A step that hands on no rows or no batch (a failure waited out,
	// nothing to publish, ctx done) begins the loop again, which ends once
	// ctx is done.
	for ctx.Err() == nil {
		rows, ok := pub.nextRows(ctx, tp, poll)
		if !ok {
			continue
		}
		batch, ok, err := pub.nextBatch(ctx, tp, rows)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		last := rows[0].seq
		if len(batch) > 0 {
			last = batch[len(batch)-1].seq
		}
		rowErrs, err := pub.send(ctx, cl, batch, last)
		if err != nil {
			if renew, err := pub.sendFailed(ctx, tp, batch, rowErrs, err); renew != nil || err != nil {
				return renew, err
			}
			continue
		}
		pub.advance(ctx, tp, batch, last)
	}
	return nil, nil
}

// txnProducer is the transactional producer a publisher publishes its
// partition with, and how far that publishing is.
type txnProducer struct {
	cl       *kgo.Client
	txnID    string
	log      *slog.Logger
	maxBytes func(string) int32 // the producer's kgo.ProducerBatchMaxBytesFn, if set
	pos      int64              // the position its committed transactions reached
	attempt  int                // the failures in a row, for the backoff
}

// backOff waits before the next try after a failure, longer with each
// failure in a row, and logs msg with args and the wait unless msg is
// empty. It reports false when ctx ended first.
func (tp *txnProducer) backOff(ctx context.Context, msg string, args ...any) bool {
	tp.attempt++
	d := backoff.Delay(tp.attempt, 100*time.Millisecond, 10*time.Second)
	if msg != "" {
		tp.log.Warn(msg, append(args, "retry_in", d)...)
	}
	return backoff.Sleep(ctx, d)
}

// nextRows reads the rows after the position, and checks that they are of
// the partition. ok is false when reading failed (it waited before the
// next try), when there are none (it waited for a writer's wake-up or the
// poll interval), or when ctx ended.
func (pub *publisher) nextRows(ctx context.Context, tp *txnProducer, poll *time.Timer) (rows []row, ok bool) {
	rows, err := pub.read(ctx, tp.pos)
	if err == nil {
		pub.misplaced(tp.log, rows)
	}
	if err != nil {
		if ctx.Err() == nil {
			tp.backOff(ctx, "kscope: outbox relay: reading the outbox failed; retrying", "err", err)
		}
		return nil, false
	}
	if len(rows) == 0 {
		pub.idle(ctx, tp.pos, poll) // false only once ctx ended
		return nil, false
	}
	return rows, true
}

// nextBatch returns the rows of the next transaction, out of rows. When
// the row at their head is one Kafka refused for good, it moves that row
// to the dead-letter table instead, and the transaction carries no row,
// only the position past it. ok is false when moving the row failed (it
// waited before the next try) or ctx ended; err is the failure that
// retrying cannot heal: the database lacks the dead-letter table.
func (pub *publisher) nextBatch(ctx context.Context, tp *txnProducer, rows []row) (batch []row, ok bool, err error) {
	// A row Kafka refused for good is moved to the dead-letter table
	// (deleted from the outbox in the same statement); then a
	// transaction that carries nothing but the position moves the
	// partition past it. Whatever happens between the two (the
	// transaction fails, the relay stops, an operator requeues the
	// row), the outbox no longer holds the row: it is never read,
	// published or dead-lettered again, and a requeued copy is the
	// only one published.
	if pub.doomed != nil && pub.doomed.seq != rows[0].seq {
		pub.doomed = nil // the position passed it meanwhile
	}
	if pub.doomed == nil && !ValidTopic(rows[0].topic) {
		// No broker takes it: no need to ask.
		pub.doomed = &refusal{seq: rows[0].seq, err: fmt.Errorf("kscope: %q is not a Kafka topic name (at most 249 of a-z A-Z 0-9 . _ -)", rows[0].topic)}
	}
	dead := pub.doomed
	if dead == nil {
		return pub.batch(rows, tp.maxBytes), true, nil
	}
	if err := pub.deadLetter(ctx, rows[0], dead.err); err != nil {
		if errors.As(err, new(*dbscope.SchemaError)) {
			return nil, false, fmt.Errorf("kscope: outbox relay: Kafka refuses the row %s for good, and it cannot be moved to the dead-letter table (it stays in the outbox, unpublished, and the partition waits): %w",
				pub.ident(rows[0]), err)
		}
		if ctx.Err() == nil {
			tp.backOff(ctx, "kscope: outbox relay: writing a refused row to the dead-letter table failed; retrying", "id", pub.ident(rows[0]), "err", err)
		}
		return nil, false, nil
	}
	pub.deadLettered(tp.log, dead, rows[0])
	return nil, true, nil
}

// sendFailed handles a transaction that failed with err. It returns an
// error that retrying cannot heal (the broker refused the transactional
// id), or renew when a new producer must take the partition over (this one
// was fenced, or cannot go on). Otherwise, after waiting when the failure
// calls for it, the producer reads the position again, and both are nil:
// publishing goes on.
func (pub *publisher) sendFailed(ctx context.Context, tp *txnProducer, batch []row, rowErrs []error, err error) (renew, fatal error) {
	switch {
	case errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		return nil, fmt.Errorf("kscope: outbox relay: the broker refused this relay its transactional id %s "+
			"(grant this client Write and Describe on it, then start the relay again): %w", tp.txnID, err)
	case errors.Is(err, errFenced):
		tp.log.Warn("kscope: outbox relay: the producer was fenced", "err", err)
		return err, nil
	}
	if ctx.Err() != nil {
		return nil, nil
	}
	pub.r.aborts.Add(1)
	if pub.failed(tp.log, batch, rowErrs, err) && !tp.backOff(ctx, "") {
		return nil, nil
	}
	// A transaction that ended in a definite answer other than a
	// fence (INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING: the
	// coordinator expired the transactional id) leaves franz-go's
	// producer failed for good, every later call answering that
	// error: a new producer takes the partition over instead of
	// this one being retried forever.
	if _, _, perr := tp.cl.ProducerID(ctx); perr != nil {
		if ctx.Err() != nil {
			return nil, nil
		}
		return fmt.Errorf("initialising the producer again: %w", perr), nil
	}
	// A commit the broker applied without the relay hearing it
	// (the answer lost, or later than the relay waited) moved the
	// position: read it again rather than publish its rows twice.
	pos, ok, err := pub.takeOver(ctx, tp.cl, tp.log)
	if !ok {
		return nil, err // nil once ctx ended
	}
	tp.pos = pos
	pub.tookOver(ctx, pos)
	return nil, nil
}

// advance moves the position to last, that of the transaction that
// committed batch, deletes the rows it passed, and counts it: the rows
// Stats counts as published are no longer in the table.
func (pub *publisher) advance(ctx context.Context, tp *txnProducer, batch []row, last int64) {
	r := pub.r
	tp.attempt = 0
	tp.pos = last
	pub.moveTo(ctx, last)
	r.published.Add(int64(len(batch)))
	r.transactions.Add(1)
	pub.committed(tp.log, last)
}

// moveTo deletes the rows the committed position pos has passed, then
// reports pos (Relay.Pending): a relay that reports a partition published
// up to pos has no row of it up to pos left in the table.
func (pub *publisher) moveTo(ctx context.Context, pos int64) {
	pub.prune(ctx, pos)
	pub.pos.Store(pos)
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
