package kscopeprom

import (
	"context"
	"strconv"
	"sync/atomic"
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
	outboxScrapeErrDesc = prometheus.NewDesc("kscope_outbox_pending_scrape_errors_total",
		"Scrapes that could not count the pending rows (the database did not answer in time).", []string{"outbox"}, nil)
)

// relayCollector reads a relay's counters and, at each scrape, its pending
// rows from the database.
type relayCollector struct {
	r       *outbox.Relay
	timeout time.Duration
	errs    atomic.Int64
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
//
// The pending and dead rows are counted at each scrape, with one query of at most
// two seconds; only the partitions this instance publishes are reported
// (each relay instance reports its own).
func (m *Metrics) WatchRelay(r *outbox.Relay) error {
	return m.reg.Register(&relayCollector{r: r, timeout: 2 * time.Second})
}

func (c *relayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{outboxPendingDesc, outboxOldestDesc, outboxPublishedDesc, outboxTxnDesc, outboxPartitionsDesc,
		outboxDeadDesc, outboxStuckDesc, outboxHaltedDesc, outboxDeadRowsDesc, outboxScrapeErrDesc} {
		ch <- d
	}
}

func (c *relayCollector) Collect(ch chan<- prometheus.Metric) {
	name := c.r.Outbox()
	st := c.r.Stats()
	ch <- prometheus.MustNewConstMetric(outboxPublishedDesc, prometheus.CounterValue, float64(st.Published), name)
	ch <- prometheus.MustNewConstMetric(outboxTxnDesc, prometheus.CounterValue, float64(st.Transactions), name, "committed")
	ch <- prometheus.MustNewConstMetric(outboxTxnDesc, prometheus.CounterValue, float64(st.Aborts), name, "aborted")
	ch <- prometheus.MustNewConstMetric(outboxPartitionsDesc, prometheus.GaugeValue, float64(st.Partitions), name)
	ch <- prometheus.MustNewConstMetric(outboxDeadDesc, prometheus.CounterValue, float64(st.DeadLettered), name)
	ch <- prometheus.MustNewConstMetric(outboxStuckDesc, prometheus.GaugeValue, float64(st.Stuck), name)
	ch <- prometheus.MustNewConstMetric(outboxHaltedDesc, prometheus.GaugeValue, float64(st.Halted), name)
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	ps, err := c.r.Pending(ctx)
	if err != nil {
		c.errs.Add(1)
	}
	ch <- prometheus.MustNewConstMetric(outboxScrapeErrDesc, prometheus.CounterValue, float64(c.errs.Load()), name)
	now := time.Now()
	for _, p := range ps {
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
