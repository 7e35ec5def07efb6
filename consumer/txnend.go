package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/commit"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/kafkaerr"
	"github.com/kscope-dev/kscope/internal/txnerr"
)

// Ending a transaction: commit or abort, and what to do when the end
// failed.

var errAborted = errors.New("kscope: the transaction aborted; its offsets did not commit")

// errRenewSession marks the end of a transactional session that cannot go
// on after a transaction whose end failed: the producer was fenced when
// it was reloaded to abort that transaction (Apache Kafka answers so when
// its transaction coordinator failed over in the middle of the end), or
// whether the transaction committed could not be read back. Run then
// starts a new session, as a restart would: its producer ID fences
// whatever of the old one is left, and it consumes from what the broker
// committed.
var errRenewSession = errors.New("kscope: a new transactional session is needed")

// renewAfter is the least time between two sessions renewed: a producer
// fenced again so soon is taken for a real fence (another producer with
// the same transactional id), which stops the runner.
const renewAfter = time.Minute

// commitOrAbort ends the transaction on the broker: it commits, with the
// partitions' offsets, unless a produce in it failed; a fenced producer or
// a timed-out transaction is fatal; it aborts when a partition's
// assignment ended while it was open. j is what joined it. reloaded
// reports that ending it failed and the producer was reloaded to abort it
// (which a producer fenced meanwhile survives only until the next
// transaction begins).
func (r *Runner) commitOrAbort(ctx context.Context, open func() time.Duration, j joined) (committed, reloaded bool, err error) {
	try, err := r.flushTxn(ctx, open)
	if err != nil {
		return false, false, err
	}
	r.flushDone()
	endCtx, points := r.txnOffsets(context.WithoutCancel(ctx))
	if try == kgo.TryCommit && r.gate.goneSinceOpen() {
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
		r.log.Info("kscope: a partition's assignment ended while the transaction was open; aborting it, and its records are consumed again")
	}
	committed, reloaded, unsettled, err := r.endSession(endCtx, try, open)
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
		r.log.Warn("kscope: ending a transaction that held nothing failed; nothing is lost or repeated", "err", unsettled)
		unsettled = nil
	}
	if unsettled != nil {
		committed, err = r.settleUnsettled(ctx, points, unsettled)
		return committed, reloaded, err
	}
	r.installOutcome(committed, points)
	return committed, reloaded, nil
}

// flushTxn waits for the produces of the transaction that ends and says
// how to end it: commit, or abort when a produce failed in a way the next
// transaction may not. A fenced producer, an output no input can be
// blamed for (txnerr.ErrUnwritable) and a write the broker's ACLs refuse
// end the runner: the transaction is aborted and the error returned.
func (r *Runner) flushTxn(ctx context.Context, open func() time.Duration) (kgo.TransactionEndTry, error) {
	ferr := r.txs.TxnFlush()
	if errors.Is(ferr, kerr.ProducerFenced) || errors.Is(ferr, kerr.InvalidProducerEpoch) {
		r.sess.End(context.WithoutCancel(ctx), kgo.TryAbort) //nolint:errcheck // fenced: nothing of ours can commit
		return kgo.TryAbort, r.txnFenced(ferr, open())
	}
	if errors.Is(ferr, txnerr.ErrUnwritable) {
		// The scope cannot tell which input to fail, or cannot dead-letter
		// it: retrying would abort the same way forever.
		r.sess.End(context.WithoutCancel(ctx), kgo.TryAbort) //nolint:errcheck // the runner stops either way
		r.commitErrs.Add(1)
		return kgo.TryAbort, fmt.Errorf("kscope: the transaction was aborted (transactional id %s): %w", r.txnID, ferr)
	}
	if kafkaerr.Fatal(ferr) {
		// Refused by the broker's ACLs: every retry would be refused
		// too. Nothing of the transaction commits; the next owner of its
		// partitions consumes its records again.
		r.sess.End(context.WithoutCancel(ctx), kgo.TryAbort) //nolint:errcheck // the runner stops either way
		r.commitErrs.Add(1)
		return kgo.TryAbort, fmt.Errorf("kscope: the transaction was aborted because the broker refused a write in it (transactional id %s); "+
			"grant this client write access to the topic it names and start the runner again: %w", r.txnID, ferr)
	}
	if ferr != nil {
		r.log.Warn("kscope: aborting the transaction; its records are consumed again", "err", ferr)
		return kgo.TryAbort, nil
	}
	return kgo.TryCommit, nil
}

// endSession ends the transaction as try says. An end that failed in a way
// the producer survives is aborted (reloaded); when it was asked to commit,
// unsettled is its error: it may have committed all the same. A fenced
// producer or a timed-out transaction is err.
func (r *Runner) endSession(endCtx context.Context, try kgo.TransactionEndTry, open func() time.Duration) (committed, reloaded bool, unsettled, err error) {
	endCtx, cancel := context.WithTimeout(endCtx, r.txnTimeout)
	defer cancel()
	committed, err = r.sess.End(endCtx, try)
	if err != nil && r.txnRecovered(endCtx, err) {
		if try == kgo.TryCommit {
			unsettled = err
		}
		return false, true, unsettled, nil
	}
	if err != nil {
		if terr := r.txnTimedOut(open(), err); terr != nil {
			return false, false, nil, terr
		}
		if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
			return false, false, nil, r.txnFenced(err, open())
		}
		return false, false, nil, fmt.Errorf("kscope: ending the transaction (transactional id %s): %w", r.txnID, err)
	}
	return committed, false, nil, nil
}

// settleUnsettled reads back whether a transaction whose end failed
// (unsettled) committed, and installs what the broker holds: the
// partitions' committed states, and a rewind to them either way.
func (r *Runner) settleUnsettled(ctx context.Context, points map[tp]txnPoint, unsettled error) (bool, error) {
	readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.txnTimeout)
	committed, err := r.committedAfterAll(readCtx, points, unsettled)
	cancel()
	if err != nil {
		return false, err
	}
	if !committed {
		r.installOutcome(false, points)
		return false, nil
	}
	// The broker committed it; the client, which took it for failed, went
	// back to the offsets before it. Every partition rewinds to what it
	// committed, and the records it holds are skipped when fetched again.
	for _, pt := range points {
		pt.part.set(pt.done)
	}
	r.commits.Add(1)
	r.obs.Commit(len(points), nil)
	r.log.Warn("kscope: ending the transaction failed, but the broker had committed it; consuming goes on from what it committed", "err", unsettled)
	r.rewindAll()
	return true, nil
}

// installOutcome counts and reports a transaction's end: committed, the
// partitions' committed states move to its points; aborted, every
// partition rewinds to its committed state.
func (r *Runner) installOutcome(committed bool, points map[tp]txnPoint) {
	if !committed {
		r.commitErrs.Add(1)
		r.obs.Commit(len(points), errAborted)
		r.rewindAll()
		return
	}
	for _, pt := range points {
		pt.part.set(pt.done)
	}
	r.commits.Add(1)
	r.obs.Commit(len(points), nil)
	if r.obs.WantsLag() {
		r.reportLag()
	}
}

// txnRecovered aborts a transaction whose commit failed in a way the
// producer survives, and reports whether it did.
func (r *Runner) txnRecovered(ctx context.Context, err error) bool {
	switch {
	case ctx.Err() != nil,
		errors.Is(err, kerr.ProducerFenced), errors.Is(err, kerr.InvalidProducerEpoch),
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed), errors.Is(err, kerr.GroupAuthorizationFailed),
		errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return false
	}
	if _, aerr := r.sess.End(ctx, kgo.TryAbort); aerr != nil {
		return false
	}
	r.log.Warn("kscope: the transaction could not commit and was aborted; its records are consumed again", "err", err)
	return true
}

// committedAfterAll reads back whether a transaction whose end failed (the
// session reported err, then settled the transaction by reloading its
// producer) committed: the group's committed offsets, read once no
// transaction is pending on them, hold one of the transaction's points
// exactly when it did (each point differs from what its partition
// committed before). Nothing to compare (no input offset moved in it, but
// a scheduled task added to it) or no answer before ctx ends is an
// errRenewSession: the new session reads the committed state from the
// broker, instead of redoing outputs that may have committed.
func (r *Runner) committedAfterAll(ctx context.Context, points map[tp]txnPoint, err error) (bool, error) {
	if len(points) == 0 {
		return false, fmt.Errorf("%w: ending a transaction failed and it moved no input offset to read its outcome back from (transactional id %s): %w", errRenewSession, r.txnID, err)
	}
	adm := kadm.NewClient(r.cl)
	for attempt := 1; ; attempt++ {
		offs, ferr := adm.FetchOffsets(kadm.RequireStable(ctx), r.cfg.Group)
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
			return false, fmt.Errorf("%w: ending a transaction failed and whether it committed could not be read back (%v; transactional id %s): %w", errRenewSession, ferr, r.txnID, err)
		}
	}
}

// txnTimedOut returns the error that reports a transaction timeout when
// the transaction that failed with err had been open for open, at least
// the transaction timeout: the broker then aborts it and fences the
// producer, and the producer's next request fails.
func (r *Runner) txnTimedOut(open time.Duration, err error) error {
	if open < r.txnTimeout {
		return nil
	}
	return fmt.Errorf("%w: the transaction was open for %s, longer than Options.TransactionTimeout (%s), "+
		"so the broker aborted it and fenced this producer; raise Options.TransactionTimeout (the broker caps it at transaction.max.timeout.ms) "+
		"or find what made producing or committing that slow: %w", txnerr.ErrTimedOut, open.Round(time.Millisecond), r.txnTimeout, err)
}

// txnFenced describes a fenced producer: by a transaction timeout when the
// transaction had been open for the transaction timeout, else by another
// producer with the same transactional id.
func (r *Runner) txnFenced(err error, open time.Duration) error {
	if terr := r.txnTimedOut(open, err); terr != nil {
		return terr
	}
	return fmt.Errorf("%w: another producer uses transactional id %s; give every member its own (Options.TransactionalID): %w", txnerr.ErrFenced, r.txnID, err)
}

// txnPoint is what one partition commits in a transaction.
type txnPoint struct {
	part *txnPart
	done commit.Done
}
