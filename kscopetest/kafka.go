package kscopetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// KafkaPipeline describes a service's Kafka-scope pipeline to the kit.
type KafkaPipeline struct {
	// Handler is the service's handler, unchanged.
	Handler txn.Handler
	// BatchHandler, instead of Handler, is the service's batch handler
	// (txn.NewBatch), unchanged.
	BatchHandler txn.BatchHandler
	// OutputTopics are the topics the handler emits to (the kit creates
	// them), and OutputsPerInput how many records it emits per valid
	// input.
	OutputTopics    []string
	OutputsPerInput int
	// Config, when not nil, adjusts the consumer configuration the kit
	// builds (brokers, group and topic are the kit's).
	Config func(consumer.Config) consumer.Config
	// Valid returns the i-th well-formed input (the kit sets topic and
	// key).
	Valid func(i int) *kgo.Record
	// Undecodable returns an input the handler rejects as poison. Nil
	// skips that scenario.
	Undecodable func() *kgo.Record
	// Options are the service's Kafka-scope options, as it runs them:
	// with Dedupe (the idempotency guard) or Versions, the kit runs the
	// duplicate, replay and (with Versions.Header) out-of-order scenarios
	// too. The kit sets TransactionalID, and CommitInterval when it is
	// zero.
	Options txn.Options
}

// Kafka runs the delivery-semantics table against p, a Kafka-scope
// pipeline, each row as the Kafka scope states its guarantee: success then
// commit, a crash mid-transaction (the member is fenced by its successor
// and no output is produced twice), retryable failure retried,
// non-retryable failure and undecodable record to the DLT inside the
// transaction, poison bounded then the DLT, batch partial failure, a
// broker fault on EndTxn, and the three rows that hold only with
// p.Options' guard or versions:
//
//   - duplicate delivery: a message sent twice (the same key and message
//     id, a later offset) produces its outputs once, its handler runs once,
//     and the runner counts it (KafkaStats.Duplicates with
//     Options.Dedupe, Stale with Options.Versions);
//   - replay: the group's offsets reset to the start, every input is
//     consumed again and none produces an output or reaches the handler;
//   - out-of-order versions (Options.Versions with Header): versions 1,
//     3, 2 of a key are applied per the gap policy (Wait: all three;
//     DeadLetter: two, and 3 to the DLT; Accept: 1 and 3, 2 stale).
//
// Without Options.Dedupe or Options.Versions the Kafka scope produces a
// repeated input's outputs again, exactly once each, so the duplicate and
// replay rows are not applicable (the Result says so, and how to turn the
// guard on); without Options.Versions, or with Versions.Extract, neither is
// the out-of-order row. The kit writes each input's message id in the
// header that p's consumer.Config.Identity reads (consumer.
// DefaultMessageIDHeader unless Identity.Header names another).
// Each scenario runs on a fresh in-process cluster (or KAFKA_BROKERS, or a
// fresh Apache Kafka broker with KSCOPE_KAFKA=apache).
func Kafka(t *testing.T, p KafkaPipeline) Report {
	t.Helper()
	var (
		mu  sync.Mutex
		rep Report
	)
	for _, sc := range append(kafkaScenarios, kafkaGuardScenarios...) {
		t.Run(sc.name, func(t *testing.T) {
			if sc.applies != nil {
				if why := sc.applies(p); why != "" {
					report(t, &mu, &rep, Result{Scenario: sc.name, Detail: notApplicable(why)})
					return
				}
			}
			h := newKafkaHarness(t, p, sc.name)
			detail := sc.run(h)
			report(t, &mu, &rep, Result{Scenario: sc.name, Detail: detail})
		})
	}
	return rep
}

type kafkaHarness struct {
	t     *testing.T
	k     *testenv.Kafka
	p     KafkaPipeline
	topic string
	group string
	txnID string                     // the transactional id of the scenario's runners
	from  map[string]map[int32]int64 // per output topic, the end offsets when the scenario began
	n     int
	idHdr string // the header the pipeline's consumer.Config.Identity reads

	inject *injector
	warns  *lastWarning // the runners' last warning, for a failing scenario's report
}

const kitIDHeader = "kscopetest-id"

func newKafkaHarness(t *testing.T, p KafkaPipeline, scenario string) *kafkaHarness {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	h := &kafkaHarness{t: t, k: k, p: p, topic: name("in", scenario), group: name(scenario), inject: newInjector(""),
		txnID: name(scenario, "txn"), from: map[string]map[int32]int64{}, warns: &lastWarning{}, idHdr: identityHeader(p.Config)}
	if err := k.CreateTopic(ctx, h.topic, 2); err != nil {
		t.Fatal(err)
	}
	created := []string{h.topic}
	for _, topic := range p.OutputTopics {
		// The service's own topics may exist already (a shared broker, an
		// earlier run): the scenario counts only what it adds to them.
		err := k.CreateTopic(ctx, topic, 2)
		switch {
		case err == nil:
			created = append(created, topic)
		case !errors.Is(err, kerr.TopicAlreadyExists):
			t.Fatal(err)
		}
		ends, err := k.EndOffsets(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		h.from[topic] = ends
	}
	removeKafka(t, k, h.group, created, h.group+".")
	return h
}

func (h *kafkaHarness) record(id string) *kgo.Record {
	r := h.p.Valid(h.n)
	h.n++
	if id == "" {
		id = fmt.Sprintf("in-%d", h.n)
	}
	r.Topic, r.Key = h.topic, []byte(id)
	r.Headers = setHeader(r.Headers, kitIDHeader, id)
	// The identity the idempotency guard keys on (Options.Dedupe): the
	// scenario's group, and with it the guard's memory, is its own.
	r.Headers = setHeader(r.Headers, h.idHdr, id)
	if v := h.p.Options.Versions; v != nil && v.Extract == nil {
		r.Headers = setHeader(r.Headers, headerOr(v.Header, sequence.DefaultHeader), strconv.Itoa(h.n))
	}
	return r
}

func (h *kafkaHarness) produce(recs ...*kgo.Record) {
	h.t.Helper()
	if err := h.k.Produce(context.Background(), recs...); err != nil {
		h.t.Fatal(err)
	}
}

// runner builds the pipeline with the kit's configuration and the
// pipeline's Options, under the transactional id txnID.
func (h *kafkaHarness) runner(txnID string) *txn.Runner {
	h.t.Helper()
	cfg := consumer.Config{
		Brokers: h.k.Brokers, Group: h.group, Topics: []string{h.topic},
		Failures: retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond},
	}
	if h.p.Config != nil {
		cfg = h.p.Config(cfg)
		cfg.Brokers, cfg.Group, cfg.Topics = h.k.Brokers, h.group, []string{h.topic}
	}
	cfg.Logger = slog.New(h.warns) // the kit reports the last warning when a scenario fails
	opts := h.p.Options
	opts.TransactionalID = txnID
	if opts.CommitInterval == 0 {
		opts.CommitInterval = 20 * time.Millisecond
	}
	if h.p.BatchHandler != nil {
		r, err := h.kafkaBatch(cfg, opts)
		if err != nil {
			h.t.Fatalf("kscopetest: building the pipeline: %v", err)
		}
		return r
	}
	r, err := txn.New(cfg, opts, txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
		err := h.inject.before(r, kitIDHeader)
		if err == nil {
			err = h.p.Handler.Handle(ctx, r, out)
		}
		h.inject.after(r, kitIDHeader, err)
		return err
	}))
	if err != nil {
		h.t.Fatalf("kscopetest: building the pipeline: %v", err)
	}
	return r
}

// run runs r in the background; stop stops it and returns Run's error.
func run(r interface{ Run(context.Context) error }) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() { cancel(); err = <-errc })
		return err
	}
}

func waitCond(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// outputs reads the output topics read_committed and counts the outputs
// the scenario added.
func (h *kafkaHarness) outputs() int {
	n := 0
	for _, t := range h.p.OutputTopics {
		for _, r := range h.k.ReadAll(h.t, t) {
			if r.Offset >= h.from[t][r.Partition] {
				n++
			}
		}
	}
	return n
}

func (h *kafkaHarness) dlt() int { return len(h.k.ReadAll(h.t, retrytopic.DLTopic(h.group))) }

// settle runs the pipeline until the input is committed, then checks the
// outputs and DLT records. It fails as soon as the outcome is decided
// otherwise: Run returned, or transactions keep aborting with none
// committing.
func (h *kafkaHarness) settle(r *txn.Runner, wantOutputs, wantDLT int) string {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	deadline := time.Now().Add(time.Minute)
	var failure string
	var runErr error
	returned := false
	var committed, abortsBefore int64 // transactions committed, and aborts before the last commit
	for !h.committed() {
		select {
		case runErr = <-errc:
			returned = true
		default:
		}
		st := r.Stats().Kafka
		if st.Committed != committed {
			committed, abortsBefore = st.Committed, st.Aborted
		}
		switch {
		case returned:
			failure = fmt.Sprintf("Run returned before the input was committed: %v", runErr)
		case time.Now().After(deadline):
			failure = "timed out waiting for the input offsets to commit"
		case st.Aborted-abortsBefore >= kitAbortsDecide:
			// The transactions keep aborting: the same records abort
			// them again each time they are consumed again.
			failure = fmt.Sprintf("%d transactions in a row aborted", st.Aborted-abortsBefore)
		}
		if failure != "" {
			failure += "; " + h.saw(r) // before stopping: what stopping logs is not the cause
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if !returned {
		runErr = <-errc
	}
	if failure != "" {
		return failure
	}
	if runErr != nil {
		return fmt.Sprintf("Run: %v", runErr)
	}
	out, dlt := h.outputs(), h.dlt()
	if out == wantOutputs && dlt == wantDLT {
		return ""
	}
	return fmt.Sprintf("%d outputs and %d DLT records, want %d and %d; %s", out, dlt, wantOutputs, wantDLT, h.saw(r))
}

// kitAbortsDecide is how many transactions aborted in a row decide that a
// scenario cannot pass: in a healthy run only an injected broker fault
// aborts one, and the next commits.
const kitAbortsDecide = 2

// saw says what a failing Kafka scenario saw: outputs, dead letters, the
// committed offsets, the runner's counters, the handler's last error and
// the runner's last warning.
func (h *kafkaHarness) saw(r *txn.Runner) string {
	st := r.Stats().Kafka
	return fmt.Sprintf("saw %d outputs, %d dead-letter records, offsets %s; the runner: %d input records committed, %d outputs, %d transactions committed, %d aborted, %d dead-lettered, %d skipped; the handler's last error: %s; the runner's last warning: %s",
		h.outputs(), h.dlt(), committedWords(h.committed()), st.Records, st.Outputs, st.Committed, st.Aborted, st.DeadLettered, st.Skipped, h.inject.lastWords(), h.warns.String())
}

// lastWarning is a slog handler that keeps the last record at WARN or above,
// with its attributes, and drops the rest.
type lastWarning struct {
	mu    sync.Mutex
	attrs []slog.Attr
	last  string
}

func (w *lastWarning) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (w *lastWarning) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	add := func(a slog.Attr) bool {
		if a.Key == "group" || a.Key == "scope" {
			return true
		}
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.attrs {
		add(a)
	}
	rec.Attrs(add)
	w.last = b.String()
	return nil
}

func (w *lastWarning) WithAttrs(attrs []slog.Attr) slog.Handler {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.attrs = append(w.attrs, attrs...)
	return w
}

func (w *lastWarning) WithGroup(string) slog.Handler { return w }

func (w *lastWarning) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == "" {
		return "none"
	}
	return w.last
}

type kafkaScenario struct {
	name string
	run  func(h *kafkaHarness) string
	// applies, when not nil, says why the scenario does not apply to p
	// ("" when it does): the kit reports it so without a harness (on
	// Apache Kafka, without starting a broker).
	applies func(p KafkaPipeline) string
}

var kafkaScenarios = []kafkaScenario{
	{name: "success_then_commit", run: func(h *kafkaHarness) string {
		for range 10 {
			h.produce(h.record(""))
		}
		return h.settle(h.runner(h.txnID), 10*h.p.OutputsPerInput, 0)
	}},
	{name: "crash_mid_transaction", run: func(h *kafkaHarness) string {
		// The first member commits, then hangs inside a transaction, as a
		// crashed or stalled process does; its successor, with the same
		// transactional id, fences it and redoes the open work.
		hang := make(chan struct{})
		h.inject.failOn("hang", func(n int) error {
			if n == 1 {
				<-hang
			}
			return nil
		})
		for range 5 {
			h.produce(h.record(""))
		}
		first := h.runner(h.txnID)
		stopFirst := run(first)
		if !waitCond(time.Minute, func() bool { return first.Stats().Kafka.Records == 5 }) {
			close(hang)
			stopFirst()
			return "the first member never committed"
		}
		h.produce(h.record(""), h.record("hang"), h.record(""), h.record(""), h.record(""))
		if !waitCond(time.Minute, func() bool { return h.inject.callsOf("hang") >= 1 }) {
			close(hang)
			stopFirst()
			return "the first member never reached the record it hangs on"
		}
		// The successor takes the transactional id (fencing the first
		// member) before it joins the group. Once it is a member, the first
		// member's handler returns: its late work must not commit, and the
		// successor redoes it when the partition moves.
		second := h.runner(h.txnID)
		stopSecond := run(second)
		joined := waitCond(time.Minute, func() bool { return h.members() == 2 })
		close(hang)
		if !joined {
			stopFirst()
			stopSecond()
			return "the successor never joined the group"
		}
		ok := waitCond(time.Minute, func() bool { return second.Stats().Kafka.Committed > 0 && h.committed() })
		stopFirst() // fenced: its error is expected
		if !ok {
			stopSecond()
			return fmt.Sprintf("the successor never committed the open work (successor %+v, first %+v)", second.Stats(), first.Stats())
		}
		if err := stopSecond(); err != nil {
			return fmt.Sprintf("Run: %v", err)
		}
		return expect(h.outputs() == 10*h.p.OutputsPerInput, "%d outputs for 10 inputs after a crash mid-transaction, want %d", h.outputs(), 10*h.p.OutputsPerInput)
	}},
	{name: "retryable_failure_retried", run: func(h *kafkaHarness) string {
		h.inject.failOn("flaky", func(n int) error {
			if n <= 2 {
				return consumer.Retryable(errors.New("kscopetest: injected transient failure"))
			}
			return nil
		})
		h.produce(h.record("flaky"))
		return h.settle(h.runner(h.txnID), h.p.OutputsPerInput, 0)
	}},
	{name: "non_retryable_failure_to_dlt", run: func(h *kafkaHarness) string {
		h.inject.failOn("bad", func(int) error { return consumer.Terminal(errors.New("kscopetest: injected terminal failure")) })
		h.produce(h.record("bad"), h.record(""))
		return h.settle(h.runner(h.txnID), h.p.OutputsPerInput, 1)
	}},
	{name: "undecodable_record_to_dlt", run: func(h *kafkaHarness) string {
		if h.p.Undecodable == nil {
			return notApplicable(noUndecodable)
		}
		bad := h.p.Undecodable()
		bad.Topic, bad.Key = h.topic, []byte("undecodable")
		h.produce(bad, h.record(""))
		return h.settle(h.runner(h.txnID), h.p.OutputsPerInput, 1)
	}},
	{name: "poison_bounded_then_dlt", run: func(h *kafkaHarness) string {
		h.inject.failOn("poison", func(int) error { return errors.New("kscopetest: injected failure, every time") })
		h.produce(h.record("poison"))
		r := h.runner(h.txnID)
		if d := h.settle(r, 0, 1); d != "" {
			return d
		}
		calls := h.inject.callsOf("poison")
		return expect(calls == retrytopic.DefaultUnknownAttempts, "poison handled %d times, budget %d", calls, retrytopic.DefaultUnknownAttempts)
	}},
	{name: "batch_partial_failure", run: func(h *kafkaHarness) string {
		var recs []*kgo.Record
		for i := range 20 {
			recs = append(recs, h.record(fmt.Sprintf("batch-%d", i)))
		}
		h.inject.failOn("batch-7", func(int) error { return consumer.Terminal(errors.New("kscopetest: injected failure mid-transaction")) })
		h.produce(recs...)
		return h.settle(h.runner(h.txnID), 19*h.p.OutputsPerInput, 1)
	}},
	{name: "broker_fault_on_end_txn", run: func(h *kafkaHarness) string {
		for range 10 {
			h.produce(h.record(""))
		}
		if _, err := h.k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.TransactionAbortable, Count: 1}); err != nil {
			return notApplicable("only the in-process kfake broker can be told to fail an EndTxn; this one is " + h.k.Kind)
		}
		return h.settle(h.runner(h.txnID), 10*h.p.OutputsPerInput, 0)
	}},
}

func (h *kafkaHarness) committed() bool { return h.k.CaughtUp(context.Background(), h.group, h.topic) }

// members is the number of members in the group's current generation (0
// while it cannot be described).
func (h *kafkaHarness) members() int {
	gs, err := h.k.Admin().DescribeGroups(context.Background(), h.group)
	if err != nil {
		return 0
	}
	g, ok := gs[h.group]
	if !ok || g.Err != nil || g.State != "Stable" {
		return 0
	}
	return len(g.Members)
}
