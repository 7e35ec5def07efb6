package consumer

import (
	"context"

	"github.com/kscope-dev/kscope/hook"
)

// guardedScope is a scope that takes Config.Dedupe: the AtLeastOnce scope,
// with a per-record handler or a batch handler.
type guardedScope interface {
	// guard returns the scope's guard, nil without Config.Dedupe.
	guard() *dedupeGuard
}

var (
	_ guardedScope = (*atLeastOnce)(nil)
	_ guardedScope = (*batchScope)(nil)
)

// guard implements guardedScope.
func (s *atLeastOnce) guard() *dedupeGuard { return s.g }

// processBatchGuarded is the batch scope's Process with the idempotency
// guard (Config.Dedupe). The batch is cut before each record whose
// identity repeats one earlier in it, and the parts run one after the
// other, so that a repeat is looked up once its original's outcome is
// known. In a part, the records whose identities the store remembers are
// duplicates (done, not handled); the batch handler takes the others, as
// without the guard; those that succeeded are remembered together, then
// ended and reported done. A record that failed leaves no mark.
func (s *batchScope) processBatchGuarded(ctx context.Context, batch []*Record, done func(*Record)) {
	g := s.g
	ids := make([]string, len(batch))
	for i, r := range batch {
		ids[i] = g.prefix + g.identity.Of(r)
	}
	for len(batch) > 0 {
		n := untilRepeat(ids)
		if !s.guardedPart(ctx, batch[:n], ids[:n], done) {
			return
		}
		batch, ids = batch[n:], ids[n:]
	}
}

// untilRepeat returns how many of ids come before the first that repeats
// an earlier one (all of them when none does).
func untilRepeat(ids []string) int {
	in := make(map[string]bool, len(ids))
	for i, id := range ids {
		if in[id] {
			return i
		}
		in[id] = true
	}
	return len(ids)
}

// guardedPart runs part, whose identities ids are all different, through
// the guard and the batch handler. It reports false when a record was
// left undone: the caller stops there.
func (s *batchScope) guardedPart(ctx context.Context, part []*Record, ids []string, done func(*Record)) bool {
	g, obs := s.g, s.obs
	seen, ok := g.seen(ctx, ids, part[0])
	if !ok {
		return false
	}
	open := seen == nil // the store did not answer: FailOpen
	idOf := make(map[*Record]string, len(part))
	var run []*Record
	for i, r := range part {
		if !open && seen[i] {
			s.duplicate(r, done)
			continue
		}
		if open {
			g.unguarded(r)
		}
		idOf[r] = ids[i]
		run = append(run, r)
	}
	var won []*Record // succeeded, to remember
	var wonIDs []string
	all := len(run) == 0 || s.run(ctx, run, done, func(r *Record) {
		won, wonIDs = append(won, r), append(wonIDs, idOf[r])
	})
	if len(won) > 0 && !g.remember(ctx, wonIDs, won[0]) {
		// Not remembered: not done either; they are delivered again,
		// after the stop or revoke that cut the store's call short.
		for _, r := range won {
			obs.End(r, hook.OutcomeAborted, nil)
		}
		return false
	}
	for _, r := range won {
		obs.End(r, hook.OutcomeSuccess, nil)
		done(r)
	}
	return all
}
