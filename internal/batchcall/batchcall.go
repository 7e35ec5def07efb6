// Package batchcall runs the records of one key-shard through a batch
// handler and then each record through its scope's own per-record path,
// which carries out the record's outcome (done, a retry in place, a retry
// topic, the dead-letter topic, a skip). The AtLeastOnce scope and the
// Kafka scope use it; the DB scope, whose batch runs in its transaction,
// has its own.
package batchcall

// First says what a record's per-record path does on its first attempt:
// when Ran is true, the batch call already ran the record, with Err as its
// outcome, and only a later attempt (a retry in place) calls the handler
// again, with a one-record batch; when Ran is false, the path calls the
// handler with a one-record batch from its first attempt.
type First struct {
	Ran bool
	Err error
}

// Calls is what Run needs of a scope.
type Calls[R any] struct {
	// Admit returns why a record is turned away before any handler, or
	// nil (scope.Engine.Admit).
	Admit func(r R) error
	// Batch calls the batch handler with rs (through
	// scope.Engine.CallBatch) and returns its error.
	Batch func(rs []R) error
	// FailedAt reads a batch error as "the records before i are done,
	// record i failed with err" (consumer.BatchError); ok is false for
	// any other error.
	FailedAt func(err error) (i int, ierr error, ok bool)
	// Each runs one record's per-record path from first; false means the
	// record was left undone (the runner stops, or the record's
	// assignment ended): Run stops there.
	Each func(r R, first First) bool
}

// Run handles recs, in order, through c. Records are admitted first; a
// record turned away goes through its per-record path alone (which calls
// Admit again and carries out the rule's outcome), and the admitted ones
// around it are batched on each side of it. A batch call that returns nil
// makes every record of it a success. A failure at i (c.FailedAt) makes
// the records before i a success and record i a failure with its error;
// the records after i are batched again after record i's outcome. Any
// other error isolates the batch: each of its records goes through its
// per-record path alone, calling the handler with a one-record batch. It
// reports false when a record was left undone.
func Run[R any](recs []R, c Calls[R]) bool {
	admitted := make([]bool, len(recs))
	for i, r := range recs {
		admitted[i] = c.Admit(r) == nil
	}
	for len(recs) > 0 {
		if !admitted[0] {
			if !c.Each(recs[0], First{}) {
				return false
			}
			recs, admitted = recs[1:], admitted[1:]
			continue
		}
		n := 1
		for n < len(recs) && admitted[n] {
			n++
		}
		next, ok := batch(recs[:n], c)
		if !ok {
			return false
		}
		recs, admitted = recs[next:], admitted[next:]
	}
	return true
}

// batch runs one batch call over run and the per-record paths it leads
// to. It returns how many records of run have an outcome.
func batch[R any](run []R, c Calls[R]) (int, bool) {
	err := c.Batch(run)
	if err == nil {
		for _, r := range run {
			if !c.Each(r, First{Ran: true}) {
				return 0, false
			}
		}
		return len(run), true
	}
	if i, ierr, ok := c.FailedAt(err); ok && i >= 0 && i < len(run) {
		for _, r := range run[:i] {
			if !c.Each(r, First{Ran: true}) {
				return 0, false
			}
		}
		if !c.Each(run[i], First{Ran: true, Err: ierr}) {
			return 0, false
		}
		return i + 1, true
	}
	for _, r := range run {
		if !c.Each(r, First{}) {
			return 0, false
		}
	}
	return len(run), true
}
