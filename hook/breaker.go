package hook

import "time"

// Breaker is what BreakerHook receives when a circuit breaker of a runner
// (consumer.Config.Breakers) changes state.
type Breaker struct {
	Group string
	Name  string    // the breaker's name (consumer.BreakerConfig.Name)
	State string    // "closed", "half-open" or "open"
	Since time.Time // when it entered State
	Err   error     // the failure that opened it (state "open"); nil otherwise
}

// BreakerHook is called at each change of a circuit breaker's state (see
// Breaker).
type BreakerHook interface {
	OnBreaker(b Breaker)
}
