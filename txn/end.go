package txn

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/kafkaerr"
	"github.com/kscope-dev/kscope/internal/txnerr"
	"github.com/kscope-dev/kscope/scope"
)

// Ending a transaction: commit or abort, and what to do when the end
// failed.

var errAborted = errors.New("kscope: the transaction aborted; its offsets did not commit")

// begin begins a transaction and lets workers join it.
func (s *kafkaScope) begin() error {
	if err := s.sess.Begin(); err != nil {
		return fmt.Errorf("kscope: beginning a transaction: %w", err)
	}
	s.gate.open()
	return nil
}

// TxnPolled implements scope.Transactor: it ends the open transaction when
// it is due (its interval passed since the first record joined, or
// MaxRecords joined, or a revoke asked), or, when stopping, ends it and
// begins no other.
func (s *kafkaScope) TxnPolled(ctx context.Context, stopping bool) error {
	at := s.gate.endAt(s.o.CommitInterval)
	if !stopping && (at.IsZero() || time.Now().Before(at)) {
		return nil
	}
	return s.endTxn(ctx, stopping)
}

// TxnPollContext implements scope.Transactor: the poll ends when the open
// transaction ends, when the scope has work due (a parked record's gap
// timeout), or at a kick (the first join of a transaction, a version
// store's wake), or it is not made (nil) when one of them is due already.
// The kick is registered before the deadline is computed, so that a worker
// joining meanwhile still ends the poll.
func (s *kafkaScope) TxnPollContext(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	s.gate.setKick(cancel)
	stop := func() {
		s.gate.setKick(nil)
		cancel()
	}
	now := time.Now()
	wake := s.tick(now)
	if at := s.gate.endAt(s.o.CommitInterval); !at.IsZero() && (wake.IsZero() || at.Before(wake)) {
		wake = at
	}
	if ctx.Err() != nil || (!wake.IsZero() && !wake.After(now)) {
		stop()
		return nil, nil
	}
	if !wake.IsZero() {
		var stopDeadline context.CancelFunc
		ctx, stopDeadline = context.WithDeadline(ctx, wake)
		return ctx, func() {
			stopDeadline()
			stop()
		}
	}
	return ctx, stop
}

// endTxn ends the open transaction: it commits what the workers added to
// it with the partitions' offsets, or aborts it and rewinds the
// partitions, and, unless the runner stops, begins the next one.
func (s *kafkaScope) endTxn(ctx context.Context, stopping bool) error {
	j := s.gate.shut()
	first := j.first
	if stopping {
		s.gate.close()
	}
	if first.IsZero() && !stopping {
		s.gate.reopen() // nothing joined: the transaction stays open
		return nil
	}
	open := func() time.Duration {
		if first.IsZero() {
			return 0
		}
		return time.Since(first)
	}
	committed, reloaded, err := s.commitOrAbort(ctx, open, j)
	if err != nil {
		// The runner stops (fenced, refused, not ended) or starts a new
		// session (scope.ErrRenewSession): nothing of the transaction is
		// known to this process to have committed, and its deliveries
		// end as aborted.
		s.ended(false)
		return err
	}
	s.ended(committed)
	if stopping {
		return nil
	}
	if err := s.sess.Begin(); err != nil {
		if reloaded && (errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)) {
			// The fence answered the reload that aborted the
			// transaction whose end failed; how long that
			// transaction was open includes reading its outcome
			// back, so it says nothing of a timeout.
			return fmt.Errorf("%w: the producer was fenced when it was reloaded after ending a transaction failed (transactional id %s): %w", scope.ErrRenewSession, s.o.TransactionalID, err)
		}
		if terr := s.txnTimedOut(open(), err); terr != nil {
			return terr
		}
		return fmt.Errorf("kscope: beginning a transaction: %w", err)
	}
	s.gate.open()
	return nil
}

// TxnAbort implements scope.Transactor: it aborts the open transaction of
// a runner that stops on an error outside the transaction's end. Left
// open, it would hold every read_committed consumer of its outputs back
// until the broker timed it out. Nothing of it commits; the partitions'
// next owner consumes its records again.
func (s *kafkaScope) TxnAbort(ctx context.Context) {
	s.gate.shut()
	s.gate.close()
	if err := s.flush(); err != nil {
		s.log.Debug("kscope: a produce of the transaction aborted at the stop failed", "err", err)
	}
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.o.TransactionTimeout)
	defer cancel()
	if _, err := s.sess.End(endCtx, kgo.TryAbort); err != nil {
		s.log.Warn("kscope: aborting the open transaction at the stop failed; the broker aborts it after the transaction timeout", "err", err, "transaction_timeout", s.o.TransactionTimeout)
	}
	s.ended(false)
}

// rewind rewinds every assigned partition to its committed state after an
// aborted transaction: each gets a new assignment (the work of the old one
// is dropped, as after a revoke), and the consumer fetches again from the
// committed offset; the records done there are skipped again. The workers
// waiting to join whose assignment ended give up.
func (s *kafkaScope) rewind() {
	s.e.Rewind(s.states.offset)
	s.gate.release()
}

// commitOrAbort ends the transaction on the broker: it commits, with the
// partitions' offsets, unless a produce in it failed; a fenced producer or
// a timed-out transaction is fatal; it aborts when a partition's
// assignment ended while it was open. j is what joined it. reloaded
// reports that ending it failed and the producer was reloaded to abort it
// (which a producer fenced meanwhile survives only until the next
// transaction begins).
func (s *kafkaScope) commitOrAbort(ctx context.Context, open func() time.Duration, j joined) (committed, reloaded bool, err error) {
	s.writeRemembered(ctx)
	try, err := s.flushTxn(ctx, open)
	if err != nil {
		return false, false, err
	}
	s.e.FlushDone()
	endCtx, points := s.txnOffsets(context.WithoutCancel(ctx))
	if try == kgo.TryCommit && s.gate.goneSinceOpen() {
		// A partition's assignment ended while the transaction was open:
		// outputs of its records may be in it, and txnOffsets left its
		// offsets out. The transactional session aborts a transaction
		// after a revoke or a loss it reported, but not after one this
		// runner ended itself (a revoke the session did not pass on,
		// endUnreported): committing would publish those outputs without
		// their input offsets, and the partition's next owner would
		// produce them again. (An assignment that ends after txnOffsets
		// has its offsets in the commit.)
		try = kgo.TryAbort
		s.log.Info("kscope: a partition's assignment ended while the transaction was open; aborting it, and its records are consumed again")
	}
	committed, reloaded, unsettled, err := s.endSession(endCtx, try, open)
	if err != nil {
		return false, false, err
	}
	if unsettled != nil && len(points) == 0 && j.inputs == 0 && !j.tasks {
		// Nothing joined it: no input record, no scheduled task, so no
		// output, and no input offset moved (the transaction markers of
		// the input count only with an offset to commit). Committed or
		// not, it changed nothing. A transaction with outputs of a
		// partition whose assignment ended while it was open was
		// aborted above; one with outputs and offsets is read back
		// below.
		s.log.Warn("kscope: ending a transaction that held nothing failed; nothing is lost or repeated", "err", unsettled)
		unsettled = nil
	}
	if unsettled != nil {
		committed, err = s.settleUnsettled(ctx, points, unsettled)
		return committed, reloaded, err
	}
	s.installOutcome(committed, points)
	return committed, reloaded, nil
}

// flushTxn waits for the produces of the transaction that ends and says
// how to end it: commit, or abort when a produce failed in a way the next
// transaction may not. A fenced producer, an output no input can be
// blamed for (txnerr.ErrUnwritable) and a write the broker's ACLs refuse
// end the runner: the transaction is aborted and the error returned.
func (s *kafkaScope) flushTxn(ctx context.Context, open func() time.Duration) (kgo.TransactionEndTry, error) {
	ferr := s.flush()
	if errors.Is(ferr, kerr.ProducerFenced) || errors.Is(ferr, kerr.InvalidProducerEpoch) {
		s.sess.End(context.WithoutCancel(ctx), kgo.TryAbort) //nolint:errcheck // fenced: nothing of ours can commit
		return kgo.TryAbort, s.txnFenced(ferr, open())
	}
	if errors.Is(ferr, txnerr.ErrUnwritable) {
		// The scope cannot tell which input to fail, or cannot dead-letter
		// it: retrying would abort the same way forever.
		s.sess.End(context.WithoutCancel(ctx), kgo.TryAbort) //nolint:errcheck // the runner stops either way
		s.e.Aborted(0, nil)
		return kgo.TryAbort, fmt.Errorf("kscope: the transaction was aborted (transactional id %s): %w", s.o.TransactionalID, ferr)
	}
	if kafkaerr.Fatal(ferr) {
		// Refused by the broker's ACLs: every retry would be refused
		// too. Nothing of the transaction commits; the next owner of its
		// partitions consumes its records again.
		s.sess.End(context.WithoutCancel(ctx), kgo.TryAbort) //nolint:errcheck // the runner stops either way
		s.e.Aborted(0, nil)
		return kgo.TryAbort, fmt.Errorf("kscope: the transaction was aborted because the broker refused a write in it (transactional id %s); "+
			"grant this client write access to the topic it names and start the runner again: %w", s.o.TransactionalID, ferr)
	}
	if ferr != nil {
		s.log.Warn("kscope: aborting the transaction; its records are consumed again", "err", ferr)
		return kgo.TryAbort, nil
	}
	return kgo.TryCommit, nil
}

// endSession ends the transaction as try says. An end that failed in a way
// the producer survives is aborted (reloaded); when it was asked to commit,
// unsettled is its error: it may have committed all the same. A fenced
// producer or a timed-out transaction is err.
func (s *kafkaScope) endSession(endCtx context.Context, try kgo.TransactionEndTry, open func() time.Duration) (committed, reloaded bool, unsettled, err error) {
	endCtx, cancel := context.WithTimeout(endCtx, s.o.TransactionTimeout)
	defer cancel()
	committed, err = s.sess.End(endCtx, try)
	if err != nil && s.txnRecovered(endCtx, err) {
		if try == kgo.TryCommit {
			unsettled = err
		}
		return false, true, unsettled, nil
	}
	if err != nil {
		if terr := s.txnTimedOut(open(), err); terr != nil {
			return false, false, nil, terr
		}
		if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
			return false, false, nil, s.txnFenced(err, open())
		}
		return false, false, nil, fmt.Errorf("kscope: ending the transaction (transactional id %s): %w", s.o.TransactionalID, err)
	}
	return committed, false, nil, nil
}

// settleUnsettled reads back whether a transaction whose end failed
// (unsettled) committed, and installs what the broker holds: the
// partitions' committed states, and a rewind to them either way.
func (s *kafkaScope) settleUnsettled(ctx context.Context, points map[tp]txnPoint, unsettled error) (bool, error) {
	readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.o.TransactionTimeout)
	committed, err := s.committedAfterAll(readCtx, points, unsettled)
	cancel()
	if err != nil {
		return false, err
	}
	if !committed {
		s.installOutcome(false, points)
		return false, nil
	}
	// The broker committed it; the client, which took it for failed, went
	// back to the offsets before it. Every partition rewinds to what it
	// committed, and the records it holds are skipped when fetched again.
	for _, pt := range points {
		pt.part.set(pt.done)
	}
	s.e.Committed(len(points), pointTopics(points)...)
	s.log.Warn("kscope: ending the transaction failed, but the broker had committed it; consuming goes on from what it committed", "err", unsettled)
	s.rewind()
	return true, nil
}

// installOutcome counts and reports a transaction's end: committed, the
// partitions' committed states move to its points; aborted, every
// partition rewinds to its committed state.
func (s *kafkaScope) installOutcome(committed bool, points map[tp]txnPoint) {
	if !committed {
		s.e.Aborted(len(points), errAborted, pointTopics(points)...)
		s.rewind()
		return
	}
	for _, pt := range points {
		pt.part.set(pt.done)
	}
	s.e.Committed(len(points), pointTopics(points)...)
}

// txnRecovered aborts a transaction whose commit failed in a way the
// producer survives, and reports whether it did.
func (s *kafkaScope) txnRecovered(ctx context.Context, err error) bool {
	switch {
	case ctx.Err() != nil,
		errors.Is(err, kerr.ProducerFenced), errors.Is(err, kerr.InvalidProducerEpoch),
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed), errors.Is(err, kerr.GroupAuthorizationFailed),
		errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return false
	}
	if _, aerr := s.sess.End(ctx, kgo.TryAbort); aerr != nil {
		return false
	}
	s.log.Warn("kscope: the transaction could not commit and was aborted; its records are consumed again", "err", err)
	return true
}

// committedAfterAll reads back whether a transaction whose end failed (the
// session reported err, then settled the transaction by reloading its
// producer) committed: the group's committed offsets, read once no
// transaction is pending on them, hold one of the transaction's points
// exactly when it did (each point differs from what its partition
// committed before). Nothing to compare (no input offset moved in it, but
// a scheduled task added to it) or no answer before ctx ends is an
// scope.ErrRenewSession: the new session reads the committed state from the
// broker, instead of redoing outputs that may have committed.
func (s *kafkaScope) committedAfterAll(ctx context.Context, points map[tp]txnPoint, err error) (bool, error) {
	if len(points) == 0 {
		return false, fmt.Errorf("%w: ending a transaction failed and it moved no input offset to read its outcome back from (transactional id %s): %w", scope.ErrRenewSession, s.o.TransactionalID, err)
	}
	adm := kadm.NewClient(s.sess.Client())
	for attempt := 1; ; attempt++ {
		offs, ferr := adm.FetchOffsets(kadm.RequireStable(ctx), s.cfg.Group)
		if ferr == nil {
			for k, pt := range points {
				if o, ok := offs.Lookup(k.topic, k.partition); ok && o.Err == nil && o.At == pt.done.Offset && o.Metadata == pt.done.Metadata() {
					return true, nil
				}
			}
			if ferr = offs.Error(); ferr == nil {
				return false, nil
			}
		}
		if !backoff.Sleep(ctx, backoff.Delay(attempt, 50*time.Millisecond, time.Second)) {
			return false, fmt.Errorf("%w: ending a transaction failed and whether it committed could not be read back (%v; transactional id %s): %w", scope.ErrRenewSession, ferr, s.o.TransactionalID, err)
		}
	}
}

// txnTimedOut returns the error that reports a transaction timeout when
// the transaction that failed with err had been open for open, at least
// the transaction timeout: the broker then aborts it and fences the
// producer, and the producer's next request fails.
func (s *kafkaScope) txnTimedOut(open time.Duration, err error) error {
	if open < s.o.TransactionTimeout {
		return nil
	}
	return fmt.Errorf("%w: the transaction was open for %s, longer than Options.TransactionTimeout (%s), "+
		"so the broker aborted it and fenced this producer; raise Options.TransactionTimeout (the broker caps it at transaction.max.timeout.ms) "+
		"or find what made producing or committing that slow: %w", txnerr.ErrTimedOut, open.Round(time.Millisecond), s.o.TransactionTimeout, err)
}

// txnFenced describes a fenced producer: by a transaction timeout when the
// transaction had been open for the transaction timeout, else by another
// producer with the same transactional id.
func (s *kafkaScope) txnFenced(err error, open time.Duration) error {
	if terr := s.txnTimedOut(open, err); terr != nil {
		return terr
	}
	return fmt.Errorf("%w: another producer uses transactional id %s; give every member its own (Options.TransactionalID): %w", txnerr.ErrFenced, s.o.TransactionalID, err)
}
