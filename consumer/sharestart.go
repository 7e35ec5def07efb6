package consumer

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
)

// configureShareGroupFirst sets the share group's configuration
// (configureShareGroup) with a client of its own, before the member's
// client exists: that client joins the group and fetches as soon as it is
// created, and a broker initialises a partition's share state at its
// first fetch, from the group's share.auto.offset.reset as it is then. Set
// afterwards, ShareFromEarliest would come too late for a new group, which
// would skip every record written before it started.
func (r *Runner) configureShareGroupFirst(ctx context.Context) error {
	opts := append(append(append([]kgo.Opt{}, r.cfg.ClientOptions...), r.extra...), kgo.SeedBrokers(r.cfg.Brokers...))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kscope: creating the Kafka client that configures the share group: %w", err)
	}
	defer cl.Close()
	return r.configureShareGroup(ctx, cl)
}
