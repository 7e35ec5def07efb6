package consumer

import (
	"context"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/guard"
)

// directCalls reports whether a handler call of f's runner needs nothing
// but the handler: no record hooks to start and end each delivery, no
// admission rule (Keep, MaxAge, a share group's MaxDeliveries), no rate
// limit, no circuit breaker, no key breaker and no HandlerTimeout. Then
// the AtLeastOnce scope calls the handler itself (deliverBatch), and a
// record that succeeds at once costs no closure and no call through the
// engine; a failure takes the usual path from its first attempt on.
func directCalls(f *failures) bool {
	c := &f.calls
	return (f.obs == nil || len(f.obs.record) == 0) && c.keep == nil && c.maxAge <= 0 && c.maxDeliveries == 0 &&
		c.limits == nil && c.breakers == nil && c.keys == nil && c.timeout <= 0
}

// deliverBatch is Process without the idempotency guard when directCalls
// holds. Each record goes as deliver takes it: not called once ctx ended
// or its partition was revoked, its call marked for the stall watch and
// guarded against a panic, done when its handler returned nil. A record
// whose first call failed goes on through the failure policy from that
// attempt (attemptsAfter), as deliver's would.
func (s *atLeastOnce) deliverBatch(ctx context.Context, batch []*Record, done func(*Record)) {
	obs := s.obs
	for _, r := range batch {
		if ctx.Err() != nil || r.Revoked() {
			obs.End(r, hook.OutcomeAborted, nil)
			return
		}
		handling(r)
		err := guard.Handle(ctx, s.h, r)
		handled(r)
		if err == nil {
			done(r)
			continue
		}
		if ok, _ := s.settle(ctx, obs, r, done, false, s.f.attemptsAfter(ctx, r, s.unordered, done, s.calling(ctx, r), err)); !ok {
			obs.End(r, hook.OutcomeAborted, nil)
			return
		}
	}
}
