package kscopeprom

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kscope-dev/kscope/outbox"
)

// The outbox relay's metrics, labeled with the outbox's name; the pending
// ones per outbox partition that this relay instance publishes.
var (
	outboxPendingDesc = prometheus.NewDesc("kscope_outbox_pending_rows",
		"Committed outbox rows not published yet, per partition this relay publishes.", []string{"outbox", "partition"}, nil)
	outboxOldestDesc = prometheus.NewDesc("kscope_outbox_oldest_pending_seconds",
		"Age of the oldest committed outbox row not published yet (0 when none).", []string{"outbox", "partition"}, nil)
	outboxPublishedDesc = prometheus.NewDesc("kscope_outbox_published_records_total",
		"Outbox records published (their Kafka transaction committed).", []string{"outbox"}, nil)
	outboxTxnDesc = prometheus.NewDesc("kscope_outbox_transactions_total",
		"Relay Kafka transactions by result: committed, or aborted (and published again).", []string{"outbox", "result"}, nil)
	outboxPartitionsDesc = prometheus.NewDesc("kscope_outbox_partitions",
		"Outbox partitions this relay publishes now.", []string{"outbox"}, nil)
	outboxDeadDesc = prometheus.NewDesc("kscope_outbox_dead_lettered_records_total",
		"Outbox rows Kafka refuses for good, moved to the dead-letter table (<prefix>outbox_dead) and not published.", []string{"outbox"}, nil)
	outboxStuckDesc = prometheus.NewDesc("kscope_outbox_stuck_partitions",
		"Outbox partitions this relay cannot publish until an operator fixes a topic: missing, refused to the relay, or refusing the records' timestamps.", []string{"outbox"}, nil)
	outboxHaltedDesc = prometheus.NewDesc("kscope_outbox_halted_partitions",
		"Outbox partitions this relay refuses to publish: their position is past the last sequence number the database handed out.", []string{"outbox"}, nil)
	outboxDeadRowsDesc = prometheus.NewDesc("kscope_outbox_dead_rows",
		"Rows in the outbox's dead-letter table now, per partition this relay publishes: waiting for an operator to requeue or discard them (kscope outbox dead).", []string{"outbox", "partition"}, nil)
	outboxStrandedDesc = prometheus.NewDesc("kscope_outbox_stranded_rows",
		"Rows of the outbox in partitions no relay of it publishes (a Writer with another Partitions wrote them).", []string{"outbox"}, nil)
	outboxMisplacedDesc = prometheus.NewDesc("kscope_outbox_misplaced_rows_total",
		"Rows read whose key hashes to another partition of the outbox (a Writer with fewer Partitions wrote them): published, but a key's order is not kept.", []string{"outbox"}, nil)
	outboxScrapeErrDesc = prometheus.NewDesc("kscope_outbox_pending_scrape_errors_total",
		"Scrapes that could not count the pending rows (the database did not answer in time).", []string{"outbox"}, nil)
)

// relayCollector reads the counters of the relays a Metrics watches and,
// at each scrape, their pending rows from the database. Each metric has
// one series per outbox (and partition): the relays of one outbox add up.
type relayCollector struct {
	timeout time.Duration

	mu     sync.Mutex
	relays []*outbox.Relay
	errs   map[string]int64 // scrapes that could not count an outbox's pending rows
}

// WatchRelay exports the metrics of an outbox relay:
//
//	kscope_outbox_pending_rows{outbox,partition}           committed rows not published yet
//	kscope_outbox_oldest_pending_seconds{outbox,partition} age of the oldest of them
//	kscope_outbox_dead_rows{outbox,partition}              rows in the dead-letter table now
//	kscope_outbox_published_records_total{outbox}          records published
//	kscope_outbox_transactions_total{outbox,result}        committed, aborted
//	kscope_outbox_partitions{outbox}                       partitions this relay publishes
//	kscope_outbox_dead_lettered_records_total{outbox}      rows Kafka refuses for good, moved to the dead-letter table
//	kscope_outbox_stuck_partitions{outbox}                 partitions waiting for a topic to be fixed (Stats.Stuck)
//	kscope_outbox_halted_partitions{outbox}                partitions whose position is ahead of the database (Stats.Halted)
//	kscope_outbox_stranded_rows{outbox}                    rows in partitions no relay of the outbox publishes (Stats.Stranded)
//	kscope_outbox_misplaced_rows_total{outbox}             rows whose key hashes to another partition (Stats.Misplaced)
//
// The pending and dead rows are counted at each scrape, with one query per
// relay, all of them within two seconds; only the partitions this
// instance publishes are reported (each relay instance reports its own).
//
// One Metrics watches any number of relays: of several outboxes, and of
// one outbox again (a relay built anew after the first one's Run
// returned). The relays of one outbox add up to its series, so a stopped
// relay's counts stay in its outbox's counters, and its gauges read 0; a
// relay stays watched as long as the Metrics. Watching the same relay
// twice is a no-op.
func (m *Metrics) WatchRelay(r *outbox.Relay) error {
	m.relayMu.Lock()
	defer m.relayMu.Unlock()
	if m.relays == nil {
		c := &relayCollector{timeout: 2 * time.Second, errs: map[string]int64{}, relays: []*outbox.Relay{r}}
		if err := m.reg.Register(c); err != nil {
			return err
		}
		m.relays = c
		return nil
	}
	c := m.relays
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.relays, r) {
		c.relays = append(c.relays, r)
	}
	return nil
}

func (c *relayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{outboxPendingDesc, outboxOldestDesc, outboxPublishedDesc, outboxTxnDesc, outboxPartitionsDesc,
		outboxDeadDesc, outboxStuckDesc, outboxHaltedDesc, outboxDeadRowsDesc, outboxScrapeErrDesc, outboxStrandedDesc, outboxMisplacedDesc} {
		ch <- d
	}
}

// outboxSums are the counters of one outbox's relays, added up.
type outboxSums struct {
	st    outbox.Stats
	parts map[int]outbox.PartitionStatus
}

func (c *relayCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	relays := slices.Clone(c.relays)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var names []string
	sums := map[string]*outboxSums{}
	failed := map[string]bool{}
	for _, r := range relays {
		name := r.Outbox()
		o := sums[name]
		if o == nil {
			o = &outboxSums{parts: map[int]outbox.PartitionStatus{}}
			sums[name] = o
			names = append(names, name)
		}
		st := r.Stats()
		o.st.Published += st.Published
		o.st.Transactions += st.Transactions
		o.st.Aborts += st.Aborts
		o.st.Partitions += st.Partitions
		o.st.DeadLettered += st.DeadLettered
		o.st.Stuck += st.Stuck
		o.st.Halted += st.Halted
		ps, err := r.Pending(ctx)
		if err != nil {
			failed[name] = true
		}
		for _, p := range ps {
			if _, dup := o.parts[p.Partition]; !dup { // two relays publishing one partition: the first watched reports it
				o.parts[p.Partition] = p
			}
		}
	}
	c.mu.Lock()
	errs := make(map[string]int64, len(names))
	for _, name := range names {
		if failed[name] {
			c.errs[name]++
		}
		errs[name] = c.errs[name]
	}
	c.mu.Unlock()
	now := time.Now()
	for _, name := range names {
		st := sums[name].st
		ch <- prometheus.MustNewConstMetric(outboxPublishedDesc, prometheus.CounterValue, float64(st.Published), name)
		ch <- prometheus.MustNewConstMetric(outboxTxnDesc, prometheus.CounterValue, float64(st.Transactions), name, "committed")
		ch <- prometheus.MustNewConstMetric(outboxTxnDesc, prometheus.CounterValue, float64(st.Aborts), name, "aborted")
		ch <- prometheus.MustNewConstMetric(outboxPartitionsDesc, prometheus.GaugeValue, float64(st.Partitions), name)
		ch <- prometheus.MustNewConstMetric(outboxDeadDesc, prometheus.CounterValue, float64(st.DeadLettered), name)
		ch <- prometheus.MustNewConstMetric(outboxStuckDesc, prometheus.GaugeValue, float64(st.Stuck), name)
		ch <- prometheus.MustNewConstMetric(outboxHaltedDesc, prometheus.GaugeValue, float64(st.Halted), name)
		ch <- prometheus.MustNewConstMetric(outboxStrandedDesc, prometheus.GaugeValue, float64(st.Stranded), name)
		ch <- prometheus.MustNewConstMetric(outboxMisplacedDesc, prometheus.CounterValue, float64(st.Misplaced), name)
		ch <- prometheus.MustNewConstMetric(outboxScrapeErrDesc, prometheus.CounterValue, float64(errs[name]), name)
		for _, p := range sums[name].parts {
			part := strconv.Itoa(p.Partition)
			age := 0.0
			if !p.Oldest.IsZero() {
				age = max(now.Sub(p.Oldest).Seconds(), 0)
			}
			ch <- prometheus.MustNewConstMetric(outboxPendingDesc, prometheus.GaugeValue, float64(p.Pending), name, part)
			ch <- prometheus.MustNewConstMetric(outboxOldestDesc, prometheus.GaugeValue, age, name, part)
			ch <- prometheus.MustNewConstMetric(outboxDeadRowsDesc, prometheus.GaugeValue, float64(p.Dead), name, part)
		}
	}
}
