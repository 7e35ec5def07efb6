package consumer

import (
	"context"
	"time"

	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/hook"
)

// processGuarded is Process with the idempotency guard (Config.Dedupe):
// the batch's identities are looked up at once; a record whose identity is
// remembered, or that repeats one that succeeded earlier in the batch, is
// a duplicate (done, not handled); the others run as usual, and those that
// succeeded are remembered together, then ended and reported done.
func (s *atLeastOnce) processGuarded(ctx context.Context, batch []*Record, done func(*Record)) {
	g, obs := s.g, s.obs
	ids := make([]string, len(batch))
	for i, r := range batch {
		ids[i] = g.prefix + g.identity.Of(r)
	}
	seen, ok := g.seen(ctx, ids, batch[0])
	if !ok {
		for _, r := range batch {
			obs.End(r, hook.OutcomeAborted, nil)
		}
		return
	}
	open := seen == nil // the store did not answer: FailOpen
	if open {
		seen = make([]bool, len(batch))
	}
	var won []*Record // succeeded, to remember
	var wonIDs []string
	var inBatch map[string]bool
	left := len(batch) // the record left undone, if any; none after it started
	for i, r := range batch {
		if seen[i] || inBatch[ids[i]] {
			s.duplicate(r, done)
			continue
		}
		if open {
			g.unguarded(r)
		}
		ok, succeeded := s.deliver(ctx, obs, r, done, true)
		if !ok {
			left = i
			break
		}
		if succeeded {
			won, wonIDs = append(won, r), append(wonIDs, ids[i])
			if inBatch == nil {
				inBatch = make(map[string]bool, len(batch)-i)
			}
			inBatch[ids[i]] = true
		}
	}
	if len(won) > 0 && !g.remember(ctx, wonIDs, won[0]) {
		// Not remembered: not done either; they are delivered again,
		// after the stop or revoke that cut the store's call short.
		for _, r := range won {
			obs.End(r, hook.OutcomeAborted, nil)
		}
		won = nil
	}
	for _, r := range won {
		obs.End(r, hook.OutcomeSuccess, nil)
		done(r)
	}
	if left < len(batch) {
		obs.End(batch[left], hook.OutcomeAborted, nil) // its delivery started; the rest never did
	}
}

// duplicate ends r, whose identity the guard remembers, as a duplicate:
// done, not handled.
func (s *atLeastOnce) duplicate(r *Record, done func(*Record)) {
	s.g.hits.Add(1)
	s.obs.Start(context.Background(), r)
	s.obs.Event(r, hook.EventDuplicate, duplicateSource)
	s.obs.End(r, hook.OutcomeDuplicate, nil)
	done(r)
}

// RunBackground implements scope.Background: with a dedupe store that
// removes expired identities when asked (a Cleanup method), it asks every
// DedupeConfig.CleanupInterval.
func (s *atLeastOnce) RunBackground(ctx context.Context) {
	if s.g == nil {
		return
	}
	c, ok := s.g.cfg.Store.(dedupe.Cleaner)
	if !ok {
		return
	}
	t := time.NewTicker(s.g.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n, err := c.Cleanup(ctx); err != nil && ctx.Err() == nil {
				s.g.log.Warn("kscope: the dedupe store's cleanup of expired identities failed; retrying at the next interval", "err", err)
			} else if n > 0 {
				s.g.log.Debug("kscope: the dedupe store removed expired identities", "removed", n)
			}
		}
	}
}
