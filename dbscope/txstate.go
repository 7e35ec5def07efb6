package dbscope

import (
	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/retrytopic"
)

// setStatus records record i's outcome in its inbox row.
func (b *batchTx) setStatus(i int, status string, attempt, stage int) {
	if status == statusApplied && b.isNew[i] {
		return // the new row's default
	}
	b.up.add(b.ids[i], status, attempt, stage, coords(b.work[i]))
}

// forget deletes record i's inbox row again if this transaction inserted
// it: the record ends here without an outcome.
func (b *batchTx) forget(i int) {
	if b.isNew[i] {
		b.undo = append(b.undo, b.ids[i])
	}
}

// routed records the outcome of record i that step routes.
func (b *batchTx) routed(i int, step retrytopic.Step, attempt int) {
	total := min(b.metas[i].Attempt+attempt, retrytopic.MaxAttempt)
	switch step.Action {
	case retrytopic.ActionRetryTopic:
		b.setStatus(i, statusRetry, total, step.Stage)
	case retrytopic.ActionDeadLetter:
		b.setStatus(i, statusDLT, total, 0)
	case retrytopic.ActionSkip:
		b.setStatus(i, statusApplied, 0, 0)
	default:
		b.forget(i)
	}
}

// unpark deletes a record's head row once it leaves the retry pipeline;
// the waiting records of its key are then released.
func (b *batchTx) unpark(i int) error {
	if !b.honour || b.work[i].Key == nil || len(b.park) == 0 {
		return nil // no key of the batch has a head (the usual case)
	}
	k := pairKey{b.metas[i].OriginalTopic, string(b.work[i].Key)}
	if !b.park.has(k, b.ids[i]) {
		return nil
	}
	b.park.remove(k, b.ids[i])
	if _, ok := b.park.head(k); !ok && b.waiting[k] {
		b.res[i].release = true
	}
	_, err := b.tx.Exec(b.ctx, b.s.sqlUnpark, b.s.o.Consumer, k.topic, b.work[i].Key, b.ids[i])
	return err
}

// isHead reports whether record i has a parked row: it is its key's head.
func (b *batchTx) isHead(i int) bool {
	if b.work[i].Key == nil || len(b.park) == 0 {
		return false
	}
	return b.park.has(pairKey{b.metas[i].OriginalTopic, string(b.work[i].Key)}, b.ids[i])
}

// setPark makes record i its key's head, at stage.
func (b *batchTx) setPark(i, stage int) error {
	k := pairKey{b.metas[i].OriginalTopic, string(b.work[i].Key)}
	v := b.version(i)
	b.park.set(k, parkRow{id: b.ids[i], offset: b.metas[i].OriginalOffset, stage: stage, version: v})
	_, err := b.tx.Exec(b.ctx, b.s.sqlPark, b.s.o.Consumer, k.topic, b.work[i].Key, b.ids[i], b.metas[i].OriginalOffset, stage, v)
	return err
}

// fail records a failure decided before the handler ran (an unreadable
// version, a version gap) the way a handler failure is recorded.
func (b *batchTx) fail(i int, herr error, step retrytopic.Step) error {
	if step.Action == retrytopic.ActionHold {
		return b.hold(i, herr, step)
	}
	b.res[i] = result{out: failedOutcome, err: herr, step: step}
	b.routed(i, step, b.attemptOf(b.work[i]))
	b.block(b.work[i])
	return nil
}

// block holds the later records of r's key (or the null-key records) in
// this transaction behind r's failure.
func (b *batchTx) block(r *consumer.Record) {
	if r.Key == nil {
		b.blockedNull = true
		return
	}
	if b.blocked == nil {
		b.blocked = make(map[string]bool)
	}
	b.blocked[string(r.Key)] = true
}

// succeed records record i's success, or its business skip (herr): its
// version advances with its effects and it leaves the parking.
func (b *batchTx) succeed(i int, herr error) error {
	b.res[i].out = applied
	if herr != nil {
		b.res[i].out = skipped
	}
	if b.vers != nil && b.work[i].Key != nil {
		if _, err := b.tx.Exec(b.ctx, b.s.sqlSaveVersion, b.s.o.Consumer, b.metas[i].OriginalTopic, b.work[i].Key, b.versions[i]); err != nil {
			return err
		}
	}
	b.setStatus(i, statusApplied, 0, 0)
	return b.unpark(i)
}

// attemptOf is the attempt number r's handler call in this transaction is.
func (b *batchTx) attemptOf(r *consumer.Record) int {
	if fi := b.fails[r]; fi != nil {
		return fi.attempts + 1
	}
	return 1
}

// version is record i's version, 0 when versions are not checked.
func (b *batchTx) version(i int) int64 {
	if b.versions == nil {
		return 0
	}
	return b.versions[i]
}
