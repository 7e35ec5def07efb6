package dbscope

// Stats are the DB scope's counters.
type Stats struct {
	Applied       int64 // records whose handler committed
	Duplicates    int64 // records skipped because their inbox row existed
	ReplaySkipped int64 // records skipped before the handler thanks to stored offsets
	Failed        int64 // handler failures (retried or dead-lettered by the failure policy)
	Skipped       int64 // records whose handler returned a business skip (their writes commit unless a failed statement aborted them)
	Parked        int64 // records sent behind an earlier record of their key that is in the retry topics
	Stale         int64 // records whose version was at or below their key's last applied one: skipped
	GapsDetected  int64 // records found ahead of their key's next version
	GapsHealed    int64 // records applied after waiting for the versions before them
	GapsAccepted  int64 // records applied over a gap (sequence.Accept)
	GapsTimedOut  int64 // records that waited past GapTimeout and went to the DLT
	TxRetries     int64 // transactions retried after a transient PostgreSQL error
	Transactions  int64 // transactions committed
}

// DBStats returns the DB scope's counters.
func (r *Runner) DBStats() Stats {
	return Stats{
		Applied:       r.s.applied.Load(),
		Duplicates:    r.s.duplicates.Load(),
		ReplaySkipped: r.s.replaySkipped.Load(),
		Failed:        r.s.failed.Load(),
		Skipped:       r.s.skipped.Load(),
		Parked:        r.s.parked.Load(),
		Stale:         r.s.stale.Load(),
		GapsDetected:  r.s.gapsDetected.Load(),
		GapsHealed:    r.s.gapsHealed.Load(),
		GapsAccepted:  r.s.gapsAccepted.Load(),
		GapsTimedOut:  r.s.gapsTimedOut.Load(),
		TxRetries:     r.s.txRetries.Load(),
		Transactions:  r.s.transactions.Load(),
	}
}
