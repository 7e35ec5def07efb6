package boltscope

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/scope"
)

// round is one round of the runner's retry loop (scope.Failures.Rounds).
type round = scope.Round[*consumer.Record]

// The status an inbox entry records: its first byte; the next eight are
// when it was written, in Unix nanoseconds, big-endian.
const (
	statusApplied byte = 'a'
	statusSkipped byte = 's'
	statusDead    byte = 'd' // acknowledged by the dead-letter topic
)

// outcome is what one attempt's transaction did with its record.
type outcome uint8

const (
	applied   outcome = iota // the handler's writes and the inbox entry committed
	duplicate                // the inbox holds the record: nothing ran
	skipped                  // a business skip: committed, as applied
	failed                   // the handler failed: rolled back
)

// errRollback ends a transaction that is rolled back on purpose: its
// record failed, or is a duplicate.
var errRollback = errors.New("boltscope: rolled back")

// Process implements scope.Scope: each record of the batch, in order, is
// applied in a transaction of its own, or routed by the failure policy,
// and done once that is durable. It returns early, leaving the rest
// undone, when ctx ends or the batch's partition is revoked.
func (s *boltScope) Process(ctx context.Context, batch []*consumer.Record, done func(*consumer.Record)) {
	for _, r := range batch {
		if !s.deliver(ctx, r, done) {
			s.obs.End(r, hook.OutcomeAborted, nil)
			return
		}
	}
}

// deliver applies r or carries out what the failure policy decided for
// it, and reports whether r is done.
//
// The record's attempts run on the failure policy (Failures.Attempts),
// each in a transaction that the handler's failure rolls back. An error
// of the file is not the record's: it ends the attempts as if the record
// had succeeded, and the round around them (Failures.Rounds) retries them
// all after a backoff, with the key-shard counted as held.
func (s *boltScope) deliver(ctx context.Context, r *consumer.Record, done func(*consumer.Record)) bool {
	hctx := s.obs.Start(ctx, r)
	id := []byte(s.identity.Of(r))
	var (
		a   scope.Attempt
		out outcome
	)
	ok := s.f.Rounds(ctx, done, func() round {
		var serr error
		a = s.f.Attempts(ctx, r, s.topics, done, func() error {
			var herr error
			out, herr, serr = s.apply(hctx, r, id)
			if serr != nil {
				return nil // not the record's failure: the round retries
			}
			return herr
		})
		switch {
		case !a.OK:
			return round{Stop: true}
		case serr != nil:
			s.storeRetries.Add(1)
			return round{More: true, Of: r, Err: serr, Held: true}
		}
		return round{}
	})
	if !ok {
		return false
	}
	if a.Err == nil {
		s.ended(r, out)
		done(r)
		return true
	}
	// A failure, or a business skip (committed already): the policy's
	// step, carried out before the record is done.
	if err := s.f.Route(ctx, r, a.Err, a.Step, a.N, a.First); err != nil {
		return false // ctx ended while routing: not done, delivered again
	}
	if a.Step.Action == retrytopic.ActionDeadLetter && !s.markDead(ctx, r, id, done) {
		return false
	}
	s.obs.End(r, scope.OutcomeOf(a.Step.Action), a.Err)
	done(r)
	return true
}

// ended ends the delivery of r, which succeeded with out.
func (s *boltScope) ended(r *consumer.Record, out outcome) {
	if out == duplicate {
		s.obs.Event(r, hook.EventDuplicate, "")
		s.obs.End(r, hook.OutcomeDuplicate, nil)
		return
	}
	s.obs.End(r, hook.OutcomeSuccess, nil)
}

// apply runs one attempt of r, of identity id, in a read-write
// transaction: a duplicate when the inbox holds id; else the handler,
// whose writes commit with id's inbox entry unless it failed. herr is the
// handler's error; serr an error of the file, which leaves nothing
// written (out and herr then say nothing).
func (s *boltScope) apply(ctx context.Context, r *consumer.Record, id []byte) (out outcome, herr, serr error) {
	serr = s.db.Update(func(tx *bolt.Tx) error {
		inbox, err := inboxOf(tx, s.group)
		if err != nil {
			return err
		}
		if holds(inbox.Get(id), r) {
			out = duplicate
			return errRollback
		}
		herr = call(ctx, s.h, tx, r)
		status := statusApplied
		switch {
		case herr == nil:
			out = applied
		case s.f.Class(herr) == retrytopic.ClassSkip:
			out, status = skipped, statusSkipped
		default:
			out = failed
			return errRollback
		}
		return inbox.Put(id, entry(status))
	})
	if errors.Is(serr, errRollback) {
		serr = nil
	}
	if serr != nil {
		return 0, nil, serr
	}
	switch out {
	case applied:
		s.applied.Add(1)
		s.transactions.Add(1)
	case skipped:
		s.skipped.Add(1)
		s.transactions.Add(1)
	case duplicate:
		s.duplicates.Add(1)
	case failed:
		s.failed.Add(1)
	}
	return out, herr, nil
}

// holds reports whether an inbox entry (nil: none) makes r a duplicate:
// any entry does, but that of a dead letter that an operator redrove.
func holds(entry []byte, r *consumer.Record) bool {
	if entry == nil {
		return false
	}
	_, redriven := r.Header(retrytopic.HeaderRedrive)
	return entry[0] != statusDead || !redriven
}

// entry returns an inbox entry of status, written now.
func entry(status byte) []byte {
	b := make([]byte, 9)
	b[0] = status
	binary.BigEndian.PutUint64(b[1:], uint64(time.Now().UnixNano()))
	return b
}

// markDead writes r's inbox entry as dead-lettered, once the dead-letter
// topic acknowledged r, so that a later copy of r is a duplicate. An
// error of the file is retried like the record's transaction; false: ctx
// ended first, and r is not done (its next delivery may dead-letter it
// again).
func (s *boltScope) markDead(ctx context.Context, r *consumer.Record, id []byte, done func(*consumer.Record)) bool {
	return s.f.Rounds(ctx, done, func() round {
		err := s.db.Update(func(tx *bolt.Tx) error {
			inbox, err := inboxOf(tx, s.group)
			if err != nil {
				return err
			}
			return inbox.Put(id, entry(statusDead))
		})
		if err != nil {
			s.storeRetries.Add(1)
			return round{More: true, Of: r, Err: err, Held: true}
		}
		s.transactions.Add(1)
		return round{}
	})
}

// call runs h through scope.Call: a panic becomes the record's failure
// (the failure policy treats it as an unclassified error, retried in place
// within the smaller budget, then dead-lettered), and its stack is logged
// once per record, so that one bad record cannot take the process down
// with every other key-shard's work.
func call(ctx context.Context, h Handler, tx *bolt.Tx, r *consumer.Record) error {
	return scope.Call(func() error { return h.Handle(ctx, tx, r) })
}
