package kscopetest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// ShareLock is the acquisition lock the share-group table's lock-expiry
// scenario gives its members (consumer.ShareConfig.LockDuration, with
// renewals off); on the in-process Kafka, every lock of the table's
// broker lasts that long. A broker that allows no lock this short (its
// group.share.min.record.lock.duration.ms, 15s by default on Apache
// Kafka) fails that scenario's runners at their start.
const ShareLock = time.Second

// DBShare runs the share-group table against p, a DB-scope pipeline run
// as a member of a share group (consumer.Config.Share: p.Config's, or the
// defaults when it sets none), and returns the report; each failing
// scenario also fails its subtest of t. The scenarios:
//
//   - success then accept: every record applied once and accepted;
//   - duplicate delivery: the same message sent twice in a row, and once
//     more after they are done, has one effect;
//   - redelivery after a lock expiry: two members, renewals off, and a
//     handler that outlives its record's lock (ShareLock) once: the broker
//     gives the record to the other member meanwhile, and it is applied
//     once;
//   - poison: an error every time, bounded retries in place, then the
//     dead-letter topic, with the delivery count the broker gave it
//     (header kscope-delivery-count), and no effect;
//   - crash mid-transaction: the handler does its work and the runner
//     stops before the commit (it gives up on the record after its drain
//     timeout): the transaction rolls back, the record is released,
//     delivered again and applied once (an effect made outside the
//     transaction shows twice);
//   - replay: the stopped group's start offsets set back to the start of
//     the topic (kadm's AlterShareGroupOffsets, what `kscope share reset`
//     does), and every record delivered again: no new effect.
//
// A share group keeps no per-key order across its members, so the
// per-key versions of [DB] are not run (the DB scope refuses
// Options.Versions with Config.Share), nor are the undecodable record,
// the retryable failure and the batch rows, which a share group routes as
// a consumer group does. The broker of the table must allow share groups
// (Kafka 4.1 or later; the in-process Kafka does).
func DBShare(t *testing.T, p DBPipeline) Report {
	t.Helper()
	k := testenv.KafkaT(t, kfake.BrokerConfigs(map[string]string{
		// Members join within 100ms, and expired locks are found within
		// 100ms; kfake's locks last as long as its broker says.
		"group.share.heartbeat.interval.ms":   "100",
		"share.record.lock.sweep.interval.ms": "100",
		"group.share.record.lock.duration.ms": strconv.FormatInt(ShareLock.Milliseconds(), 10),
	}))
	config := p.Config
	p.Config = func(c consumer.Config) consumer.Config {
		if config != nil {
			c = config(c)
		}
		sc := consumer.ShareConfig{}
		if c.Share != nil {
			sc = *c.Share
		}
		c.Share = &sc
		return c
	}
	return tableOn(t, k, shareScenarios, func(t *testing.T) pipeline { return dbPipeline(t, p) })
}

// shareStats sums the share-group counters and the runs of rs.
func shareStats(rs ...kitRunner) (accepted, done, duplicates int64) {
	for _, r := range rs {
		st := r.Stats()
		accepted += st.Share.Accepted
		done += st.Done
		duplicates += st.DB.Duplicates
	}
	return accepted, done, duplicates
}

// started is a runner running in the background.
type started struct {
	r      kitRunner
	cancel context.CancelFunc
	errc   chan error
}

// start runs r until stop.
func start(r kitRunner) *started {
	ctx, cancel := context.WithCancel(context.Background())
	s := &started{r: r, cancel: cancel, errc: make(chan error, 1)}
	go func() { s.errc <- r.Run(ctx) }()
	return s
}

// stop stops the runner and returns how its Run ended.
func (s *started) stop() string {
	s.cancel()
	if err := <-s.errc; err != nil {
		return fmt.Sprintf("Run: %v", err)
	}
	return ""
}

// expectAgain says that the handler of the record with this id may run
// again without a failure of its own: a delivery whose transaction did not
// commit (a lock that expired, a runner that stopped).
func (in *injector) expectAgain(id string) {
	in.mu.Lock()
	in.failed[id] = true
	in.mu.Unlock()
}

// crashOn makes the calls of the record with this id whose handler
// returned nil return f(call number) instead, before the scope commits.
func (in *injector) crashOn(id string, f func(n int) error) {
	in.mu.Lock()
	in.crashAfter[id] = f
	in.mu.Unlock()
}

// crash returns the failure crashOn injects into this call of r, after
// its handler returned nil.
func (in *injector) crash(r *consumer.Record, idHeader string) error {
	id := in.idOf(r, idHeader)
	in.mu.Lock()
	n, f := in.calls[id], in.crashAfter[id]
	in.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(n)
}

// returned counts the calls of the record with this id that returned
// (the pipeline's handler included).
func (in *injector) returned(id string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.ended[id]
}
