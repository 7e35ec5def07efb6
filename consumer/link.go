package consumer

import (
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/engine/link"
)

// The runner's internals that kscope's scope packages build on reach them
// through internal/engine, not through this package's API.
func init() {
	link.NewRunner = newRunnerFor
	link.CheckConfig = func(cfg Config) (Config, error) {
		cfg = cfg.withDefaults()
		return cfg, cfg.validate()
	}
	link.NewObserver = func(group string, hooks []hook.Hook) any { return newObserver(group, hooks) }
	link.ObserverOf = func(f any) any { return f.(*failures).obs }
	link.DueOf = dueOf
	link.OutcomeOf = outcomeOf
	link.ShardOf = shardOf
	link.RevokedCh = revokedCh
	link.Handling = handling
	link.Handled = handled
}
