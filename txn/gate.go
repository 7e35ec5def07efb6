package txn

import (
	"sync"
	"time"

	"github.com/kscope-dev/kscope/consumer"
)

// gate lets key-shard workers add finished records to the open Kafka
// transaction, and the poll loop end it while none is adding. A worker
// joins only once its record is finished: a record that retries in place
// waits between its attempts outside any transaction, so it holds its
// key-shard and nothing else.
type gate struct {
	mu     sync.Mutex
	cond   sync.Cond
	isOpen bool      // workers may join
	first  time.Time // when the first worker joined the open transaction (or progress was called)
	joins  int       // input records joined
	tasks  int       // joins without an input record (scheduled tasks)
	joined int       // workers adding now
	closed bool      // the runner stops: nothing joins any more
	kick   func()    // wakes the poll loop
	kicked bool      // a wake came while no poll was waiting
	max    int       // input records after which the transaction ends early
	due    bool      // the open transaction ends at the poll loop's next turn (endSoon)
	gone   bool      // an assignment ended while the transaction was open (markGone)
}

func newGate(maxRecords int) *gate {
	g := &gate{max: maxRecords}
	g.cond.L = &g.mu
	return g
}

// join waits for an open transaction and reports whether rec may join it:
// not when the runner stops or rec's assignment ended (revoked, lost or
// rewound after an abort). A caller that joined calls leave.
func (g *gate) join(rec *consumer.Record) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for !g.isOpen && !g.closed && !rec.Revoked() {
		g.cond.Wait()
	}
	if g.closed || rec.Revoked() {
		return false
	}
	g.joined++
	if g.first.IsZero() {
		g.first = time.Now()
		g.wake()
	}
	return true
}

// progress records that the open transaction has offsets to commit
// though no worker joined it: transaction markers of the input, counted
// done as they were polled. It then ends as if a worker had joined now.
// Only the poll loop calls it, which is also the one that ends
// transactions, so the gate is open unless the runner stops.
func (g *gate) progress() {
	g.mu.Lock()
	if g.isOpen && g.first.IsZero() {
		g.first = time.Now()
	}
	g.mu.Unlock()
}

// leave ends a join; input says whether it added an input record.
func (g *gate) leave(input bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.joined--
	if input {
		g.joins++
		if g.joins == g.max {
			g.wake()
		}
	} else {
		g.tasks++
	}
	if g.joined == 0 {
		g.cond.Broadcast()
	}
}

// wake wakes the poll loop. A wake that comes while no poll waits is kept
// for the next one, so that it is not lost between two polls.
func (g *gate) wake() {
	if g.kick != nil {
		g.kick()
		return
	}
	g.kicked = true
}

// setKick registers the function that wakes the poll loop (nil between
// polls); a wake kept since the last poll calls it at once.
func (g *gate) setKick(f func()) {
	g.mu.Lock()
	g.kick = f
	if f != nil && g.kicked {
		g.kicked = false
		f()
	}
	g.mu.Unlock()
}

// endSoon makes the open transaction end at the poll loop's next turn,
// even if nothing joined it, and wakes the poll loop; called between the
// end of one transaction and the opening of the next, it makes the next
// one end at once. After a revoke or a loss the transactional session
// reports no other revoke or loss until a transaction ends: a member that
// stayed idle would miss the next one and keep the partitions it took as
// its own.
func (g *gate) endSoon() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.due = true
	if g.isOpen && g.first.IsZero() {
		g.first = time.Now()
	}
	g.wake()
}

// markGone records that a partition's assignment ended (revoked, lost,
// or ended by the runner) while the transaction was open: records of it
// may have added outputs to it, whose input offsets it no longer commits
// (see kafkaScope.commitOrAbort).
func (g *gate) markGone() {
	g.mu.Lock()
	g.gone = true
	g.mu.Unlock()
}

// goneSinceOpen reports whether markGone was called since the open
// transaction opened.
func (g *gate) goneSinceOpen() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gone
}

// open lets workers join a new transaction.
func (g *gate) open() {
	g.mu.Lock()
	g.isOpen, g.first, g.joins, g.tasks, g.gone = true, time.Time{}, 0, 0, false
	if g.due {
		g.first = time.Now() // endSoon came while the last one ended
	}
	g.cond.Broadcast()
	g.mu.Unlock()
}

// shut stops workers from joining the open transaction, waits for those
// adding to it, and returns what joined it: when the first joined (zero
// when none did), how many input records, and whether a scheduled task (a
// join without an input record) added to it.
func (g *gate) shut() joined {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.isOpen, g.due = false, false
	for g.joined > 0 {
		g.cond.Wait()
	}
	return joined{first: g.first, inputs: g.joins, tasks: g.tasks > 0}
}

// joined is what joined a transaction (gate.shut).
type joined struct {
	first  time.Time // when the first worker joined (or progress was called); zero when none did
	inputs int       // input records added
	tasks  bool      // a scheduled task (a join without an input record) added to it
}

// reopen lets workers join the transaction shut left open (nothing joined
// it).
func (g *gate) reopen() {
	g.mu.Lock()
	g.isOpen = true
	if g.due && g.first.IsZero() {
		g.first = time.Now() // endSoon came while it was shut
	}
	g.cond.Broadcast()
	g.mu.Unlock()
}

// close releases every worker waiting to join: nothing joins any more.
func (g *gate) close() {
	g.mu.Lock()
	g.closed, g.isOpen = true, false
	g.cond.Broadcast()
	g.mu.Unlock()
}

// release wakes the workers waiting to join, so that those whose
// assignment ended give up.
func (g *gate) release() {
	g.mu.Lock()
	g.cond.Broadcast()
	g.mu.Unlock()
}

// endAt returns when the open transaction ends: interval after its first
// join (or progress), at once when it holds max input records or endSoon
// asked, or never (zero) while nothing joined it and no marker was counted
// done.
func (g *gate) endAt(interval time.Duration) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.isOpen || g.first.IsZero() {
		return time.Time{}
	}
	if g.due || g.joins >= g.max {
		return g.first
	}
	return g.first.Add(interval)
}
