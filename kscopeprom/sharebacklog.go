package kscopeprom

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
)

// DefaultShareGroupInterval is how often WatchShareGroup reads a share
// group's backlog when its caller does not say.
const DefaultShareGroupInterval = 30 * time.Second

// WatchShareGroup exports, until ctx is done, the backlog of cfg's share
// group on each partition it consumes:
//
//	kscope_share_backlog_records{consumer_group,topic,partition}
//
// the records the group has not acknowledged yet (those in flight
// included), as 'kscope share describe' prints it: the broker's lag of
// the partition where it reports one (Kafka 4.1 and later), else the
// partition's end offset minus the group's share-partition start offset
// (which Apache Kafka moves past acknowledged records only now and then). It reads it
// every interval (0: DefaultShareGroupInterval), with a client of its own
// (cfg.Brokers and cfg.ClientOptions) and two requests to the brokers
// (again while the group's coordinator moves, up to 30 seconds a read). It
// is off unless a service calls it: run it next to a member of the group,
// in one or in each (every member then reports the same backlog;
// aggregate with max, not sum). A read that fails is logged as a WARN on
// cfg.Logger and drops the group's series until the next one succeeds,
// so that a stale value is never shown. A partition has a series once
// the broker reports the group's state of it (Apache Kafka: after the
// group's first acknowledgement there), and loses it when the group no
// longer consumes it. It returns nil when ctx is done, and an
// error at once for a cfg without Brokers, Group or Share, or a negative
// interval.
func (m *Metrics) WatchShareGroup(ctx context.Context, cfg consumer.Config, interval time.Duration) error {
	switch {
	case len(cfg.Brokers) == 0 || cfg.Group == "" || cfg.Share == nil:
		return errors.New("kscopeprom: WatchShareGroup needs the share-group runner's Config, with its Brokers, Group and Share")
	case interval < 0:
		return fmt.Errorf("kscopeprom: WatchShareGroup's interval is %v; give a positive one, or 0 for %v", interval, DefaultShareGroupInterval)
	case interval == 0:
		interval = DefaultShareGroupInterval
	}
	cfg = cfg.WithDefaults()
	gauge, err := m.shareBacklog()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, cfg.ClientOptions...), kgo.SeedBrokers(cfg.Brokers...))...)
	if err != nil {
		return fmt.Errorf("kscopeprom: creating the Kafka client of WatchShareGroup: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	group := prometheus.Labels{"consumer_group": cfg.Group}
	defer gauge.DeletePartialMatch(group)
	shown := map[[2]string]bool{}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		backlog, err := readBacklog(ctx, adm, cfg.Group)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			gauge.DeletePartialMatch(group)
			clear(shown)
			cfg.Logger.Warn("kscope: reading the share group's backlog failed; kscope_share_backlog_records is left out until a read succeeds",
				"group", cfg.Group, "err", err)
		default:
			shown = showBacklog(gauge, cfg.Group, backlog, shown)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// shareReadTimeout bounds one read of a share group's backlog.
const shareReadTimeout = 30 * time.Second

// readBacklog reads group's backlog within shareReadTimeout, again every
// 100ms while it fails with an error Kafka says is retriable (a group
// coordinator that moves or loads: kadm does not retry a group's errors).
func readBacklog(ctx context.Context, adm *kadm.Client, group string) (map[string]map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, shareReadTimeout)
	defer cancel()
	for {
		backlog, err := shareGroupBacklog(ctx, adm, group)
		if err == nil || !kerr.IsRetriable(err) {
			return backlog, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// showBacklog sets the series of backlog and deletes those of shown that
// it no longer has; it returns the series it set.
func showBacklog(gauge *prometheus.GaugeVec, group string, backlog map[string]map[int32]int64, shown map[[2]string]bool) map[[2]string]bool {
	now := map[[2]string]bool{}
	for topic, ps := range backlog {
		for p, n := range ps {
			part := strconv.Itoa(int(p))
			gauge.WithLabelValues(group, topic, part).Set(float64(n))
			now[[2]string{topic, part}] = true
		}
	}
	for tp := range shown {
		if !now[tp] {
			gauge.DeleteLabelValues(group, tp[0], tp[1])
		}
	}
	return now
}

// shareGroupBacklog returns the backlog of share group group per topic
// and partition it consumes: the broker's lag, else the partition's end
// offset minus the group's share-partition start offset (a partition the
// group has not started is left out). It is what
// kscope_share_backlog_records shows.
func shareGroupBacklog(ctx context.Context, adm *kadm.Client, group string) (map[string]map[int32]int64, error) {
	offs, err := adm.DescribeShareGroupOffsets(ctx, group)
	if err == nil {
		err = offs[group].Err
	}
	if err != nil {
		return nil, fmt.Errorf("describing the start offsets of share group %s: %w", group, err)
	}
	starts := offs[group].Offsets
	out := map[string]map[int32]int64{}
	if len(starts) == 0 {
		return out, nil
	}
	topics := make([]string, 0, len(starts))
	for t := range starts {
		topics = append(topics, t)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing the end offsets of share group %s's topics: %w", group, err)
	}
	starts.Each(func(so kadm.ShareOffset) {
		end, ok := ends.Lookup(so.Topic, so.Partition)
		if so.Err != nil || so.StartOffset < 0 || !ok {
			return
		}
		if out[so.Topic] == nil {
			out[so.Topic] = map[int32]int64{}
		}
		if so.Lag >= 0 {
			out[so.Topic][so.Partition] = so.Lag
		} else {
			out[so.Topic][so.Partition] = max(end.Offset-so.StartOffset, 0)
		}
	})
	return out, nil
}

// shareBacklog returns kscope_share_backlog_records, registered at the
// first call.
func (m *Metrics) shareBacklog() (*prometheus.GaugeVec, error) {
	m.shareMu.Lock()
	defer m.shareMu.Unlock()
	if m.backlog == nil {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kscope_share_backlog_records",
			Help: "A share group's records not yet acknowledged on a partition: the broker's lag, else its end offset minus the share-partition start offset."},
			[]string{"consumer_group", "topic", "partition"})
		if err := m.reg.Register(g); err != nil {
			return nil, fmt.Errorf("kscopeprom: registering kscope_share_backlog_records: %w", err)
		}
		m.backlog = g
	}
	return m.backlog, nil
}
