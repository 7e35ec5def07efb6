package kscopeprom

import (
	"errors"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kscope-dev/kscope/consumer"
)

// The metrics of WatchShare, read from the runners' Stats at each scrape.
var (
	shareAcceptedDesc = prometheus.NewDesc("kscope_share_accepted_total",
		"Records a share-group member acknowledged as accepted: effect durable, or routed (consumer.ShareStats.Accepted).", []string{"consumer_group"}, nil)
	shareReleasedDesc = prometheus.NewDesc("kscope_share_released_total",
		"Records a share-group member released unfinished, for another member (consumer.ShareStats.Released).", []string{"consumer_group"}, nil)
	shareRedeliveredDesc = prometheus.NewDesc("kscope_share_redelivered_total",
		"Records delivered to a share-group member with a delivery count above 1 (consumer.ShareStats.Redelivered).", []string{"consumer_group"}, nil)
	shareRenewalsDesc = prometheus.NewDesc("kscope_share_lock_renewals_total",
		"Acquisition locks a share-group member renewed for records still running (consumer.ShareStats.Renewals).", []string{"consumer_group"}, nil)
	shareRefusedDesc = prometheus.NewDesc("kscope_share_acks_refused_total",
		"Acknowledgement requests the broker refused for a partition, mostly of records whose locks had expired (consumer.ShareStats.AcksRefused).", []string{"consumer_group"}, nil)
	shareExhaustedDesc = prometheus.NewDesc("kscope_share_deliveries_exhausted_total",
		"Records dead-lettered past consumer.ShareConfig.MaxDeliveries (consumer.ShareStats.Exhausted).", []string{"consumer_group"}, nil)
	shareLocksLostDesc = prometheus.NewDesc("kscope_share_locks_lost_total",
		"Records a share-group member finished after their acquisition lock had expired (consumer.ShareStats.LocksLost): the broker may have given them to another member.", []string{"consumer_group"}, nil)
	shareInFlightDesc = prometheus.NewDesc("kscope_share_in_flight_records",
		"Records a share-group member acquired and has not finished (consumer.Stats.InFlight).", []string{"consumer_group"}, nil)
)

// shareCollector reads the Stats of the share-group runners WatchShare
// was given.
type shareCollector struct {
	mu      sync.Mutex
	runners []*consumer.Runner
}

// WatchShare exports the counters of r, a share-group runner
// (consumer.Config.Share set), read from r.Stats() at each scrape:
//
//	kscope_share_accepted_total{consumer_group}              records acknowledged as accepted
//	kscope_share_released_total{consumer_group}              records released unfinished
//	kscope_share_redelivered_total{consumer_group}           records delivered with a delivery count above 1
//	kscope_share_lock_renewals_total{consumer_group}         acquisition locks renewed
//	kscope_share_acks_refused_total{consumer_group}          acknowledgements the broker refused
//	kscope_share_deliveries_exhausted_total{consumer_group}  records dead-lettered past MaxDeliveries
//	kscope_share_locks_lost_total{consumer_group}            records finished after their lock expired
//	kscope_share_in_flight_records{consumer_group}           records acquired and not finished
//
// One Metrics watches any number of runners: the members of one share
// group that run in one process add up to its series, so that a stopped
// runner's counts stay in them (a runner stays watched as long as the
// Metrics). Watching a runner twice is a no-op. It returns an error for a
// runner of a consumer group. The broker's side of a share group, its
// backlog per partition, is [Metrics.WatchShareGroup]'s.
func (m *Metrics) WatchShare(r *consumer.Runner) error {
	if r == nil || r.Config().Share == nil {
		return errors.New("kscopeprom: WatchShare needs a share-group runner (consumer.Config.Share set); a consumer group's runner is counted by the hooks of Metrics")
	}
	m.shareMu.Lock()
	defer m.shareMu.Unlock()
	if m.shares == nil {
		c := &shareCollector{runners: []*consumer.Runner{r}}
		if err := m.reg.Register(c); err != nil {
			return err
		}
		m.shares = c
		return nil
	}
	c := m.shares
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.runners, r) {
		c.runners = append(c.runners, r)
	}
	return nil
}

// Describe implements prometheus.Collector.
func (c *shareCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{shareAcceptedDesc, shareReleasedDesc, shareRedeliveredDesc, shareRenewalsDesc, shareRefusedDesc, shareExhaustedDesc, shareLocksLostDesc, shareInFlightDesc} {
		ch <- d
	}
}

// shareSums are the Stats of one group's runners, added up.
type shareSums struct {
	share    consumer.ShareStats
	inFlight int64
}

// Collect implements prometheus.Collector.
func (c *shareCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	runners := slices.Clone(c.runners)
	c.mu.Unlock()
	var groups []string
	sums := map[string]*shareSums{}
	for _, r := range runners {
		g := r.Config().Group
		s := sums[g]
		if s == nil {
			s = &shareSums{}
			sums[g] = s
			groups = append(groups, g)
		}
		st := r.Stats()
		s.share.Accepted += st.Share.Accepted
		s.share.Released += st.Share.Released
		s.share.Redelivered += st.Share.Redelivered
		s.share.Renewals += st.Share.Renewals
		s.share.AcksRefused += st.Share.AcksRefused
		s.share.Exhausted += st.Share.Exhausted
		s.share.LocksLost += st.Share.LocksLost
		s.inFlight += st.InFlight
	}
	for _, g := range groups {
		s := sums[g]
		for d, v := range map[*prometheus.Desc]int64{shareAcceptedDesc: s.share.Accepted, shareReleasedDesc: s.share.Released,
			shareRedeliveredDesc: s.share.Redelivered, shareRenewalsDesc: s.share.Renewals, shareRefusedDesc: s.share.AcksRefused,
			shareExhaustedDesc: s.share.Exhausted, shareLocksLostDesc: s.share.LocksLost} {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), g)
		}
		ch <- prometheus.MustNewConstMetric(shareInFlightDesc, prometheus.GaugeValue, float64(s.inFlight), g)
	}
}
