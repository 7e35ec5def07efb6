package consumer

// The runner's Kafka client: its options and its creation, for a plain
// group session or a transactional one.

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// clientOptions are the runner's client options: the runner's defaults and
// the scope's, the user's, the scope's own, then the ones the runner's
// guarantees rest on, which win.
func (r *Runner) clientOptions() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(500 * time.Millisecond),
	}
	opts = append(opts, r.patternDefaults()...)
	opts = append(opts, r.defaults...)
	opts = append(opts, r.cfg.ClientOptions...)
	opts = append(opts, r.extra...)
	opts = append(opts,
		kgo.SeedBrokers(r.cfg.Brokers...),
		kgo.ConsumerGroup(r.cfg.Group),
		kgo.DisableAutoCommit(),
		kgo.RebalanceTimeout(r.cfg.RebalanceTimeout),
		kgo.OnPartitionsAssigned(r.onAssigned),
		kgo.OnPartitionsRevoked(r.onRevoked),
		kgo.OnPartitionsLost(r.onLost),
		kgo.WithHooks(&r.brokers, &r.proto),
		// Transaction markers reach dispatchAll, which counts them done
		// at once (a transactional runner, once the records it holds
		// back before them are dispatched; see markersPolledLocked):
		// the committed offset then passes a transaction's
		// last marker, and a caught-up group shows no lag (without them
		// it would stop one short, at the marker, on every partition a
		// transactional producer writes).
		kgo.KeepControlRecords(),
	)
	opts = append(opts, r.cfg.groupProtocolOptions()...)
	// A transactional runner consumes once its producer ID is
	// initialised (newClient), so that it joins the group only then.
	opts = append(opts, r.consumeOptions()...)
	if r.txs != nil {
		// A transactional session aborts the open transaction at a
		// rebalance itself, and ends transactions between polls: a
		// rebalance is not blocked while records are dispatched (a
		// revoked partition's records are dropped by the pool).
		return opts
	}
	return append(opts, kgo.BlockRebalanceOnPoll())
}

// consumedAtStart are the topics the client consumes from its creation:
// none for a transactional runner (see newClient).
func (r *Runner) consumedAtStart() []string {
	if r.txs != nil {
		return nil
	}
	return r.topics()
}

// newClient creates the runner's client: a transactional session for a
// transactor scope, whose producer ID is initialised before it joins the
// group and polls (it fences the previous incarnation of the transactional
// id and aborts its open transaction; until then the group's offsets that
// transaction committed are unstable, and the consumer, which fetches them
// with RequireStable, would wait for the broker to time it out).
func (r *Runner) newClient(ctx context.Context) (*kgo.Client, error) {
	if r.share != nil {
		return r.newShareClient(ctx)
	}
	if r.txs == nil {
		cl, err := kgo.NewClient(r.clientOptions()...)
		if err != nil {
			return nil, fmt.Errorf("kscope: creating the Kafka client: %w", err)
		}
		return cl, nil
	}
	sess, err := kgo.NewGroupTransactSession(r.clientOptions()...)
	if err != nil {
		return nil, fmt.Errorf("kscope: creating the transactional client: %w", err)
	}
	if _, _, err := sess.Client().ProducerID(ctx); err != nil {
		sess.Close()
		return nil, fmt.Errorf("kscope: initialising the producer ID of transactional id %s: %w", r.txnID, err)
	}
	// The scope gets the session, and begins its first transaction, before
	// the client joins the group: a partition revoked or lost from then on
	// reaches an open transaction (scope.Transactor's TxnGone).
	r.sess = sess
	if err := r.txs.UseTxn(txnEngine{r}); err != nil {
		sess.Close()
		return nil, err
	}
	// Only now does the client join the group. A member that joined
	// before (the first initialisation on a new cluster can take seconds)
	// could lose partitions in two rebalances before its first
	// transaction began, and the session reports one revoke per
	// transaction: the second would go unseen, leaving a partition the
	// runner takes for its own.
	sess.Client().AddConsumeTopics(r.topics()...)
	return sess.Client(), nil
}
