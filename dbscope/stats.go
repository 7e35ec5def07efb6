package dbscope

import "github.com/kscope-dev/kscope/consumer"

// ReportStats implements scope.StatsReporter: the runner's Stats carry the
// DB scope's counters in Stats.DB.
func (s *dbScope) ReportStats(st *consumer.Stats) {
	st.Waiting = s.waiting.get()
	st.DB = consumer.DBStats{
		Applied:         s.applied.Load(),
		Duplicates:      s.duplicates.Load(),
		ReplaySkipped:   s.replaySkipped.Load(),
		Failed:          s.failed.Load(),
		Skipped:         s.skipped.Load(),
		Parked:          s.parked.Load(),
		Stale:           s.stale.Load(),
		GapsDetected:    s.gapsDetected.Load(),
		GapsHealed:      s.gapsHealed.Load(),
		GapsAccepted:    s.gapsAccepted.Load(),
		GapsTimedOut:    s.gapsTimedOut.Load(),
		VersionsSkipped: s.versionsSkipped.Load(),
		GapsFilled:      s.gapsFilled.Load(),
		TxRetries:       s.txRetries.Load(),
		Transactions:    s.transactions.Load(),
		HeldKeys:        int(s.heldKeys.Load()),
	}
}
