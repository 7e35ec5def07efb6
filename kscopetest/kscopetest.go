// Package kscopetest is a delivery-semantics test kit for services built on
// kscope. Given a DB-scope pipeline — its handler, its schema, how to make
// an input record and how to count its effects — [DB] runs the scenarios
// production throws at a consumer against it, on an in-process Kafka (kfake)
// and a throwaway PostgreSQL (or KAFKA_BROKERS / DATABASE_URL), and reports
// which guarantees hold. [AtLeastOnce] runs the same table against an
// AtLeastOnce pipeline (consumer.New): the rows that need each record
// applied once (duplicate delivery, the crash before the offset commit,
// replay) with the pipeline's idempotency guard (consumer.Config.Dedupe),
// and reported as not applicable without it. [Kafka] runs it against a
// Kafka-scope pipeline, as that scope states each guarantee. [Scope] runs
// the same table against a scope of the service's own (another store,
// built on package scope and run by consumer.NewScoped): given how to open
// a fresh store, how to build the runner on it and how to count its
// effects ([ScopePipeline]), it runs every scenario below but the per-key
// versions, which are the DB scope's. [DBShare] runs a table of share-group
// scenarios against a DB-scope pipeline run as a member of a share group
// (consumer.Config.Share): duplicates, a lock that expired, poison, a
// crash mid-transaction and a replay, each with one effect per record.
//
// The scenarios:
//
//   - success then commit: every record applied once, offsets committed;
//   - duplicate delivery: the same message sent twice in a row, and once
//     more after they are done, has one effect;
//   - crash before the offset commit: redelivered records are no-ops;
//   - retryable failure: retried with backoff, then applied once;
//   - non-retryable failure: to the dead-letter topic, no effect;
//   - undecodable record: to the dead-letter topic, no effect;
//   - poison (an error every time): bounded retries, then the DLT;
//   - out-of-order versions: handled per the gap policy (when versioned);
//   - batch partial failure: the rest of the batch commits;
//   - replay: consuming the topic again causes no new effect.
//
// A pipeline's batch handler ([DBPipeline].BatchHandler,
// [KafkaPipeline].BatchHandler) runs the same tables as a per-record one.
//
// A scenario that does not apply to the pipeline (the undecodable record
// without [DBPipeline].Undecodable or [ScopePipeline].Undecodable,
// out-of-order versions without Options.Versions or with a version
// extractor, a duplicate or a replay in the AtLeastOnce or Kafka scope
// without its guard), to its scope (per-key versions in the AtLeastOnce
// scope) or to the backend is not run: its subtest is skipped (t.Skip)
// with the reason, and its [Result] says Skipped.
//
// In every scenario the kit also counts the handler's calls per message
// id: a record whose handler ran more than once although none of its calls
// failed (a record before a failing one in its batch, say) is reported in
// [Result].Repeats and fails the scenario. The kit wraps a DB-scope or an
// AtLeastOnce handler itself; a scope of the service's own runs its
// handler's work through the kit's [Faults], which the kit hands to
// [ScopePipeline].Runner, and a scenario in which the kit counted no call
// fails, saying so.
//
// Each scenario runs as a subtest on a fresh topic, group and database (or,
// in [Scope], store), so
// a failure names the guarantee that broke. A scenario fails as soon as its
// outcome is decided (every record done and a few commit intervals passed
// without the expected effects; for the Kafka scope, Run returning or two
// transactions in a row aborting), not after a timeout, and says what it
// saw: effects or outputs, dead-letter records, the committed offsets, the
// runner's counters, the handler's last error and, for the Kafka scope, the
// runner's last warning (an output topic that does not exist, say). With
// KSCOPE_KAFKA=apache the same suites run on
// Apache Kafka, started from its Maven Central artifacts on the machine's
// JDK (Maven and a JDK 17 or newer needed; the first run downloads the
// broker once); there the crash before the offset commit is made by
// committing the group's offsets back to the start after the first runner
// stopped, and the broker fault on EndTxn, which only kfake can inject, is
// skipped. With KSCOPE_TEST_CONTAINERS=1 they run on Apache
// Kafka and PostgreSQL in Docker containers, in a test binary that imports
// the container provider, a Go module of its own so that only its users
// download testcontainers:
//
//	import _ "github.com/kscope-dev/kscope/kscopetest/containers"
//
// # What a run creates, and removes
//
// Every topic and group a scenario creates is named kt-<scenario>-<run>,
// where <run> is random per test binary, so that runs against one shared
// broker (KAFKA_BROKERS, `kscope dev`) never collide; a Kafka pipeline's
// OutputTopics are created when missing, and a scenario counts only the
// outputs it added to them. When a scenario ends, it deletes its topics
// (input, dead-letter, retry and version topics, and the output topics it
// created) and its group, and drops its database. With DATABASE_URL the
// role needs CREATEDB (each scenario creates a database of its own); without
// it, the kit starts a throwaway PostgreSQL server from the Debian
// packages' binaries: call [Main] from TestMain so that the server, its
// process and its data directory, are gone when the tests end, also when
// they fail or are interrupted:
//
//	func TestMain(m *testing.M) { kscopetest.Main(m) }
//
// [AtLeastOnce] and [Kafka] need no PostgreSQL, nor does [Scope]: its
// scenarios open the store through [ScopePipeline].Open, in the
// scenario's temporary directory, say; each still runs on a topic and
// group of its own, removed when it ends.
package kscopetest

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
)

// Result is one scenario's outcome.
type Result struct {
	Scenario string
	// Held says that the scenario ran and its guarantee held.
	Held bool
	// Skipped says that the scenario does not apply to this pipeline (no
	// Undecodable, no Versions, no idempotency guard), its scope (per-key
	// versions in the AtLeastOnce scope) or backend (a broker fault on a
	// real broker): it did not run, its subtest was skipped (t.Skip) and
	// Detail says why.
	Skipped bool
	Detail  string // what broke, or why the scenario did not apply
	// Repeats counts the handler's calls of each message id that was
	// handled more than once although none of its calls returned an error
	// (a business skip aside): in the DB scope a handler runs again only
	// for a record that failed or whose transaction did not commit.
	Repeats map[string]int
}

// Report lists the scenarios' results.
type Report []Result

// Held reports whether every scenario that applied held.
func (r Report) Held() bool {
	for _, x := range r {
		if !x.Held && !x.Skipped {
			return false
		}
	}
	return true
}

// table runs scenarios, each as a subtest on a fresh topic, group and
// pipeline (open makes it, with the scenario's store), and returns the
// report.
func table(t *testing.T, scenarios []scenario, open func(t *testing.T) pipeline) Report {
	t.Helper()
	return tableOn(t, testenv.KafkaT(t), scenarios, open)
}

// tableOn is table on the Kafka k.
func tableOn(t *testing.T, k *testenv.Kafka, scenarios []scenario, open func(t *testing.T) pipeline) Report {
	t.Helper()
	var (
		mu  sync.Mutex
		rep Report
	)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			p := open(t)
			if p.applies != nil {
				if why := p.applies(sc.name); why != "" {
					report(t, &mu, &rep, Result{Scenario: sc.name, Detail: notApplicable(why)})
					return
				}
			}
			h := newHarness(t, k, p, sc.name)
			detail := sc.run(h)
			repeats := h.inject.repeats()
			if detail == "" && len(repeats) > 0 {
				detail = repeatsDetail(repeats)
			}
			if h.produced > 0 && h.inject.total() == 0 && !strings.HasPrefix(detail, skipPrefix) {
				detail = strings.TrimSuffix(noCalls+"; "+detail, "; ")
			}
			report(t, &mu, &rep, Result{Scenario: sc.name, Detail: detail, Repeats: repeats})
		})
	}
	return rep
}

// noCalls is the detail of a scenario whose records reached no handler
// call the kit could count.
const noCalls = "the kit counted no call of the handler: the scope's handler must run each record's work through Faults.Call (see ScopePipeline.Runner), " +
	"or the kit can neither inject its failures nor count the handler's calls"

// skipPrefix starts the detail of a scenario that does not apply.
const skipPrefix = "not applicable: "

// notApplicable is what a scenario returns when it does not apply, and why.
func notApplicable(why string) string { return skipPrefix + why }

// report adds res, whose Detail is what its scenario returned, to rep, and
// fails or skips t as the scenario's outcome says.
func report(t *testing.T, mu *sync.Mutex, rep *Report, res Result) {
	_, res.Skipped = strings.CutPrefix(res.Detail, skipPrefix)
	res.Held = res.Detail == ""
	mu.Lock()
	*rep = append(*rep, res)
	mu.Unlock()
	switch {
	case res.Held:
	case res.Skipped:
		t.Skip(res.Detail)
	default:
		t.Error(res.Detail)
	}
}

// pipeline is what the scenarios need of the pipeline under test, in any
// scope built on the contract, with its store open for one scenario.
type pipeline struct {
	valid       func(i int) *kgo.Record
	undecodable func() *kgo.Record // nil: the pipeline has none
	config      func(consumer.Config) consumer.Config
	// build builds a runner on the scenario's store, its handler run
	// through f.
	build func(cfg consumer.Config, f *Faults) (kitRunner, error)
	// effects counts the effects in the scenario's store.
	effects func(ctx context.Context) (int, error)
	// versions is the DB scope's Options.Versions (nil elsewhere).
	versions *sequence.Config
	// duplicates reads the runner's count of the duplicates it did not
	// hand to the handler (the DB scope's inbox, the AtLeastOnce scope's
	// guard); nil when the runner keeps no such counter (a scope of the
	// service's own).
	duplicates func(consumer.Stats) int64
	// applies, when not nil, says why the scenario of that name does not
	// apply to the pipeline's scope ("" when it does): the kit reports it
	// as not applicable, with that reason, without running it.
	applies func(scenario string) string
	// what names the pipeline's description in the kit's messages.
	what string
}

// kitRunner is a runner the scenarios run: a *consumer.Runner, or a scope
// package's runner that embeds one.
type kitRunner interface {
	Run(ctx context.Context) error
	Stats() consumer.Stats
	Config() consumer.Config
}

// harness is one scenario's fresh topic, group and store.
type harness struct {
	t        *testing.T
	k        *testenv.Kafka
	p        pipeline
	topic    string
	group    string
	n        int    // records made so far
	produced int    // records produced to the topic
	idHdr    string // the header the pipeline's consumer.Config.Identity reads

	inject *injector
}

func newHarness(t *testing.T, k *testenv.Kafka, p pipeline, scenario string) *harness {
	h := &harness{t: t, k: k, p: p, topic: name(scenario), group: name(scenario), inject: newInjector(kitIDPrefix(scenario)),
		idHdr: identityHeader(p.config)}
	if err := k.CreateTopic(context.Background(), h.topic, 1); err != nil {
		t.Fatal(err)
	}
	removeKafka(t, k, h.group, []string{h.topic}, h.group+".")
	return h
}

// record returns the next valid record, keyed key, with a message id of its
// own (or id, when not empty).
func (h *harness) record(key, id string) *kgo.Record {
	r := h.p.valid(h.n)
	h.n++
	if id == "" {
		id = fmt.Sprintf("msg-%d", h.n)
	}
	r.Topic, r.Key = h.topic, []byte(key)
	r.Headers = setHeader(r.Headers, h.idHeader(), h.inject.prefix+id)
	if v := h.p.versions; v != nil && v.Extract == nil {
		r.Headers = setHeader(r.Headers, headerOr(v.Header, sequence.DefaultHeader), strconv.Itoa(h.n))
	}
	return r
}

func (h *harness) idHeader() string { return h.idHdr }

// identityHeader returns the header that the consumer configuration
// config makes (its Identity.Header) carries a record's identity, which
// the kit writes: the default one without config or Identity.Header.
func identityHeader(config func(consumer.Config) consumer.Config) string {
	if config == nil {
		return consumer.DefaultMessageIDHeader
	}
	return headerOr(config(consumer.Config{}).Identity.Header, consumer.DefaultMessageIDHeader)
}

// kitRuns numbers the scenarios a test binary runs, for kitIDPrefix.
var kitRuns atomic.Int64

// kitIDPrefix returns the prefix of the message ids a scenario writes: its
// name, the run's id and the scenario's number in the test binary, so that
// a dedupe store shared by every scenario (an AtLeastOnce pipeline's
// consumer.Config.Dedupe.Store), or by two runs of the kit, never holds an
// id of another scenario's records.
func kitIDPrefix(scenario string) string {
	return fmt.Sprintf("%s#%d/", name(scenario), kitRuns.Add(1))
}

func headerOr(h, def string) string {
	if h == "" {
		return def
	}
	return h
}

func setHeader(hs []kgo.RecordHeader, k, v string) []kgo.RecordHeader {
	out := hs[:0:0]
	for _, h := range hs {
		if h.Key != k {
			out = append(out, h)
		}
	}
	return append(out, kgo.RecordHeader{Key: k, Value: []byte(v)})
}

func (h *harness) produce(recs ...*kgo.Record) {
	h.t.Helper()
	if err := h.k.Produce(context.Background(), recs...); err != nil {
		h.t.Fatal(err)
	}
	h.produced += len(recs)
}

// runner builds the pipeline on the scenario's store, with the kit's
// configuration, its handler run through the kit's Faults to count calls
// and to inject the failures the scenario asks for.
func (h *harness) runner(adjust func(*consumer.Config)) kitRunner {
	h.t.Helper()
	cfg := consumer.Config{
		Brokers: h.k.Brokers, Group: h.group, Topics: []string{h.topic},
		CommitInterval: 20 * time.Millisecond, DrainTimeout: 5 * time.Second,
		Logger: slog.New(slog.DiscardHandler),
		Failures: retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
			Ladder: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
	}
	if h.p.config != nil {
		cfg = h.p.config(cfg)
		cfg.Brokers, cfg.Group, cfg.Topics = h.k.Brokers, h.group, []string{h.topic}
	}
	if adjust != nil {
		adjust(&cfg)
	}
	r, err := h.p.build(cfg, &Faults{in: h.inject, idHeader: h.idHeader()})
	switch {
	case err != nil:
		h.t.Fatalf("kscopetest: building the pipeline: %v", err)
	case r == nil:
		h.t.Fatalf("kscopetest: %s returned no runner and no error", h.p.what)
	}
	return r
}

func (h *harness) callsOf(id string) int { return h.inject.callsOf(id) }

// committedWords says, for a report, whether the offsets reached the end.
func committedWords(toEnd bool) string {
	if toEnd {
		return "committed to the end"
	}
	return "not committed to the end"
}

// until runs r until cond holds (or a minute passes), then stops it.
func (h *harness) until(r kitRunner, what string, cond func() bool) string {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	deadline := time.Now().Add(time.Minute)
	var failure string
	var allDone time.Time // since when every record produced has been done
	// How long after that a condition may still come true: the next
	// offset commits, with room to spare.
	grace := max(2*time.Second, 3*r.Config().CommitInterval)
	for !cond() {
		now := time.Now()
		if now.After(deadline) {
			failure = "timed out waiting for " + what
			break
		}
		// Every record produced has a durable outcome (its effects and
		// dead letters are visible before it counts as done), and a few
		// commit intervals more brought nothing: the outcome is decided.
		switch {
		case r.Stats().Done < int64(h.produced):
			allDone = time.Time{}
		case allDone.IsZero():
			allDone = now
		case now.Sub(allDone) > grace && !cond():
			failure = "every record was done without " + what
		}
		if failure != "" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		return fmt.Sprintf("Run: %v", err)
	}
	if failure == "" {
		return ""
	}
	return failure + "; " + h.saw(r)
}

// saw says what a failing scenario saw: effects, dead letters, the
// committed offsets, the runner's counters and the handler's last error.
func (h *harness) saw(r kitRunner) string {
	st := r.Stats()
	dups := "no count of duplicates"
	if h.p.duplicates != nil {
		dups = fmt.Sprintf("%d duplicates", h.p.duplicates(st))
	}
	return fmt.Sprintf("saw %d effects, %d dead-letter records, offsets %s; the runner: %d of %d records done, %d retried in place, %d dead-lettered, %d skipped, %d applied, %s; the handler's last error: %s",
		h.effects(), len(h.dlt()), committedWords(h.committed()), st.Done, h.produced, st.Failures.Retries, st.Failures.DeadLettered, st.Failures.Skipped, st.DB.Applied, dups, h.inject.lastWords())
}

// rewind sets the group's committed offset of the scenario's topic back to
// its start, as if the group had never committed. The group must be empty.
func (h *harness) rewind() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var start kadm.Offsets
	start.Add(kadm.Offset{Topic: h.topic, Partition: 0, At: 0, LeaderEpoch: -1})
	resp, err := h.k.Admin().CommitOffsets(ctx, h.group, start)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("kscopetest: rewinding group %s to the start of %s: %w", h.group, h.topic, err)
	}
	return nil
}

func (h *harness) effects() int {
	n, err := h.p.effects(context.Background())
	if err != nil {
		h.t.Fatalf("kscopetest: the pipeline's Effects: %v", err)
	}
	return n
}

func (h *harness) dlt() []*kgo.Record { return h.k.ReadAll(h.t, retrytopic.DLTopic(h.group)) }

func (h *harness) committed() bool { return h.k.CaughtUp(context.Background(), h.group, h.topic) }
