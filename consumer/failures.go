package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/dlreason"
	"github.com/kscope-dev/kscope/internal/kafkaerr"
	"github.com/kscope-dev/kscope/internal/ratelog"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/scope"
)

// Failures applies a runner's failure policy (Config.Failures): it
// classifies a handler error, decides between a retry, a skip and the
// dead-letter topic, and produces dead-letter records. Scopes receive it
// through scope.Engine; handlers never see it.
type failures struct {
	policy   retrytopic.Policy
	group    string
	identity Identity
	cl       *kgo.Client
	log      *slog.Logger
	obs      *observer

	dltLog *ratelog.Limiter // one ERROR line per dead letter, up to a burst per window
	hold   deploymentHold   // key-shards held by a deployment error (Round.Held)
	stacks panicStacks      // the records whose panic stack was logged
	calls  callRules        // the handler call's rules (handlercall.go)

	skipped, deadLettered, dltErrors, retries atomic.Int64
	routed                                    atomic.Int64
	decodeFailures                            atomic.Int64 // records dead-lettered for a retrytopic.DecodeFailure
	topics                                    bool
}

// engineOf is the scope.Engine a runner hands its scope: the failures of
// its session, and its records' key-shards and stall watch.
type engineOf struct{ f *failures }

func (e engineOf) Failures() scope.Failures[*Record] { return e.f }
func (e engineOf) Observer() scope.Observer[*Record] { return e.f.obs }
func (e engineOf) Shard(r *Record) int               { return int(r.shard) }
func (e engineOf) Handling(r *Record)                { handling(r) }
func (e engineOf) Handled(r *Record)                 { handled(r) }

// newDLTLog returns the limiter of a runner's dead-letter ERROR lines: 10
// one by one every 10 seconds, the rest counted.
func newDLTLog() *ratelog.Limiter { return ratelog.New(10, 10*time.Second) }

// Class classifies err under the policy.
func (f *failures) Class(err error) Class { return f.classOf(err) }

// Decide returns what follows a failed attempt of rec, counting attempts
// made on earlier hops (from rec's headers) plus attempt, those made here on
// this hop. topics says whether the record may go to a retry topic; it may
// only when the scope also said it uses them (scope.RetryTopicUser), since
// the runner creates and consumes them only then. It has no effect: Route
// carries the decision out.
func (f *failures) Decide(ctx context.Context, rec *Record, err error, attempt int, topics bool) retrytopic.Step {
	if err == errKeyHeld {
		return retrytopic.Step{Action: retrytopic.ActionHold, Class: retrytopic.ClassRetryable} // behind its key's held records
	}
	meta, herr := retrytopic.FromRecord(rec.Record, f.identity.Of(rec))
	if herr != nil {
		f.log.LogAttrs(ctx, slog.LevelWarn, "kscope: record carries corrupt kscope headers; ignoring them", f.recordAttrs(rec, attempt, herr, 0)...)
	}
	if attempt, rec.breakerWait = f.breakerWait(rec, err, attempt); rec.breakerWait {
		return retrytopic.Step{Action: retrytopic.ActionRetry, Class: f.classOf(err)}
	}
	if st, ok := f.calls.keys.decide(f, rec, err); ok {
		return st
	}
	total := min(meta.Attempt+attempt, retrytopic.MaxAttempt)
	return f.policy.Next(f.classOf(err), total, attempt, meta.Stage, topics && f.topics)
}

// Route carries out step for rec. For a skip it logs and counts; for a
// retry topic or the dead-letter topic it produces the record with its
// failure metadata and waits for the broker's acknowledgement, retrying the
// produce with backoff until it succeeds or ctx is done (then it returns
// ctx's error and the record is not done). firstFailure is when the record
// first failed on this hop.
func (f *failures) Route(ctx context.Context, rec *Record, err error, step retrytopic.Step, attempt int, firstFailure time.Time) error {
	if step.Action == retrytopic.ActionSkip && f.skippedByAdmission(ctx, rec, err) {
		return nil
	}
	meta, _ := retrytopic.FromRecord(rec.Record, f.identity.Of(rec))
	total := min(meta.Attempt+attempt, retrytopic.MaxAttempt)
	// A handler panic's stack goes in the first line about the record
	// that has it; the later ones carry the panic's value alone.
	stack := f.stacks.attrs(meta.ID, err)
	switch step.Action {
	case retrytopic.ActionSkip:
		f.skipped.Add(1)
		f.stacks.forget(meta.ID)
		f.log.LogAttrs(ctx, slog.LevelInfo, "kscope: record skipped (business outcome)", append(f.recordAttrs(rec, total, err, 0), append(stack, slog.String("outcome", string(hook.OutcomeSkipped)))...)...)
	case retrytopic.ActionRetry:
		if rec.breakerWait {
			if f.log.Enabled(ctx, slog.LevelDebug) {
				f.log.LogAttrs(ctx, slog.LevelDebug, "kscope: handler failed while a circuit breaker is open; the record waits in place", append(f.recordAttrs(rec, total, err, 0), slog.String("outcome", "waiting"))...)
			}
			break
		}
		f.retries.Add(1)
		f.obs.Event(rec, hook.EventRetry, retryReason(err, step.Class))
		f.log.LogAttrs(ctx, levelForAttempt(attempt), "kscope: handler failed; retrying in place",
			append(f.recordAttrs(rec, total, err, step.Delay), append(stack, slog.String("class", step.Class.String()), slog.String("outcome", "retrying"))...)...)
	case retrytopic.ActionDeadLetter, retrytopic.ActionRetryTopic:
		out := f.routedRecord(rec, err, step, attempt, firstFailure)
		topic := out.Topic
		kind := "dlt"
		if step.Action == retrytopic.ActionRetryTopic {
			kind = "retry"
		}
		reason := ""
		if step.Action == retrytopic.ActionDeadLetter {
			reason = dlreason.Of(err, step.Class)
		}
		if err := f.produce(ctx, hook.Route{Topic: rec.Topic, Kind: kind, Class: step.Class.String(), Reason: reason}, out); err != nil {
			return err
		}
		if step.Action == retrytopic.ActionRetryTopic {
			f.obs.Event(rec, hook.EventRetryTopic, topic)
			f.routed.Add(1)
			f.log.LogAttrs(ctx, slog.LevelWarn, "kscope: record sent to a retry topic",
				append(f.recordAttrs(rec, total, err, step.Delay), append(stack, slog.String("class", step.Class.String()), slog.String("retry_topic", topic), slog.String("outcome", string(hook.OutcomeRetried)))...)...)
			break
		}
		f.deadLettered.Add(1)
		f.stacks.forget(meta.ID)
		f.undecodable(rec, err)
		f.obs.Event(rec, hook.EventDeadLetter, out.Topic)
		f.dltLog.Log(ctx, f.log, slog.LevelError, "kscope: record sent to the dead-letter topic", "records sent to the dead-letter topic",
			append(f.recordAttrs(rec, total, err, 0), append(stack, slog.String("class", step.Class.String()), slog.String("dlt", out.Topic), slog.String("reason", reason), slog.String("outcome", string(hook.OutcomeDeadLettered)))...)...)
	}
	return nil
}

// routedRecord builds the record that carries rec to the retry topic or the
// dead-letter topic of step, with its failure metadata.
func (f *failures) routedRecord(rec *Record, err error, step retrytopic.Step, attempt int, firstFailure time.Time) *kgo.Record {
	meta, _ := retrytopic.FromRecord(rec.Record, f.identity.Of(rec))
	now := time.Now()
	meta.Group, meta.Owner = f.group, f.calls.owner
	if n := rec.DeliveryCount(); n > 0 {
		meta.DeliveryCount = n
	}
	meta.Attempt = min(meta.Attempt+spent(rec, attempt), retrytopic.MaxAttempt)
	if meta.FirstFailure.IsZero() {
		meta.FirstFailure = firstFailure
	}
	meta.LastFailure = now
	meta.Error = err.Error()
	meta.Class = step.Class
	meta.Due, meta.Stage, meta.Parked = time.Time{}, -1, false
	meta.ExpectedVersion, meta.ActualVersion = 0, 0
	var gap *retrytopic.VersionGapError
	if errors.As(err, &gap) {
		meta.ExpectedVersion, meta.ActualVersion = gap.Expected, gap.Actual
	}
	meta.DecodeMetadata(err)
	topic, spring := f.policy.DeadLetterTopic, f.policy.SpringHeaders
	if step.Action == retrytopic.ActionRetryTopic {
		topic, spring = step.Topic, false
		meta.Due, meta.Stage = now.Add(step.Delay), step.Stage
	}
	out := &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value, Headers: meta.Headers(rec.Headers, spring)}
	f.obs.Inject(f.obs.Context(context.Background(), rec), out)
	return out
}

// DeadLetterRecord returns the dead-letter record of rec after a failure
// that step sends to the DLT, for a scope that produces it itself (the
// Kafka scope, inside its transaction).
func (f *failures) DeadLetterRecord(rec *Record, err error, step retrytopic.Step, attempt int, firstFailure time.Time) *kgo.Record {
	step.Action = retrytopic.ActionDeadLetter
	f.undecodable(rec, err)
	return f.routedRecord(rec, err, step, attempt, firstFailure)
}

// RetryTopicRecord returns the record that carries rec to the retry topic
// of step (an ActionRetryTopic step), with its failure metadata and due
// time, for a scope that produces it itself (the Kafka scope, inside its
// transaction).
func (f *failures) RetryTopicRecord(rec *Record, err error, step retrytopic.Step, attempt int, firstFailure time.Time) *kgo.Record {
	step.Action = retrytopic.ActionRetryTopic
	return f.routedRecord(rec, err, step, attempt, firstFailure)
}

// Observer returns the runner's hooks, for a scope to report its
// deliveries.
func (f *failures) Observer() *observer { return f.obs }

// EnsureFailureTopics makes sure cfg's dead-letter topic (and, when
// retryTopics is set, its retry topics) exist, creating them unless the
// policy says not to. cfg must have its defaults (Runner.Config).
func ensureFailureTopics(ctx context.Context, cfg Config, retryTopics bool) error {
	// The runner's first requests: they give up within
	// startupRetryTimeout (unless the options say otherwise), so that a
	// broker that cannot be reached or spoken to stops Run with an error
	// instead of a silent wait.
	opts := append([]kgo.Opt{kgo.RetryTimeout(startupRetryTimeout)}, cfg.ClientOptions...)
	adm, err := kgo.NewClient(append(opts, kgo.SeedBrokers(cfg.Brokers...))...)
	if err != nil {
		return fmt.Errorf("kscope: creating the Kafka client: %w", err)
	}
	defer adm.Close()
	f := &failures{policy: cfg.Failures, group: cfg.Group, cl: adm, topics: retryTopics, log: cfg.Logger}
	return f.ensureTopics(ctx, sourceTopics(ctx, adm, cfg))
}

// LeftoverRetryTopics returns the retry topics of cfg's group that its
// failure policy no longer uses (a rung removed from the Ladder, or
// DisableRetryTopics set; all of them when retryTopics is false), with
// their delays, and which of them still hold records the group has not
// consumed. A runner consumes every one of them, holding each record until
// its due time, so that what waits in them (and, in the DB scope, the
// records of its key parked behind it) is not stranded. An empty one is
// consumed too: during a rolling deployment the members that still run the
// earlier policy keep sending records to it after this runner started, and
// once they are gone no other member would read them.
func leftoverRetryTopics(ctx context.Context, cfg Config, retryTopics bool) (left map[string]time.Duration, holding map[string]bool, err error) {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, cfg.ClientOptions...), kgo.SeedBrokers(cfg.Brokers...))...)
	if err != nil {
		return nil, nil, fmt.Errorf("kscope: creating the Kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	used := map[string]bool{}
	if retryTopics {
		for _, t := range cfg.Failures.RetryTopics() {
			used[t] = true
		}
	}
	all, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("kscope: listing topics to find retry topics left by an earlier failure policy: %w", err)
	}
	left = map[string]time.Duration{}
	var names []string
	for t := range all {
		if d, ok := retrytopic.RetryTopicDelay(cfg.Group, t); ok && !used[t] {
			left[t] = d
			names = append(names, t)
		}
	}
	if len(used) > 0 || len(left) > 0 {
		if err := retryTopicsShared(ctx, adm, cfg); err != nil {
			return nil, nil, err
		}
	}
	if len(left) == 0 {
		return nil, nil, nil
	}
	committed, err := adm.FetchOffsetsForTopics(ctx, cfg.Group, names...)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kscope: reading the group's offsets of retry topics left by an earlier failure policy: %w", err)
	}
	waiting, err := unconsumed(ctx, adm, committed, names)
	if err != nil {
		return nil, nil, fmt.Errorf("kscope: reading the offsets of retry topics left by an earlier failure policy: %w", err)
	}
	holding = map[string]bool{}
	for t := range waiting {
		holding[t] = true
	}
	return left, holding, nil
}

// unconsumed returns, per topic of topics that holds any, how many records
// a group whose committed offsets are committed has not consumed: those
// past its committed offset (or the partition's start, when that is later
// or nothing is committed) up to the partition's end.
func unconsumed(ctx context.Context, adm *kadm.Client, committed kadm.OffsetResponses, topics []string) (map[string]int64, error) {
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return nil, err
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, err
	}
	waiting := map[string]int64{}
	ends.Each(func(e kadm.ListedOffset) {
		from := int64(0)
		if s, ok := starts.Lookup(e.Topic, e.Partition); ok {
			from = s.Offset
		}
		if c, ok := committed.Lookup(e.Topic, e.Partition); ok && c.At >= 0 {
			from = max(from, c.At)
		}
		if e.Err == nil && e.Offset > from {
			waiting[e.Topic] += e.Offset - from
		}
	})
	return waiting, nil
}

// retryTopicsShared returns an error naming another consumer group of the
// cluster whose id maps to the same topic-safe name as cfg's group
// (retrytopic.SafeName: "pay/v2" and "pay_v2", or two ids alike in their
// first 180 characters): the two would share their retry topics, and
// each would handle the other's records. A cluster that does not let
// this client list its groups is not checked.
func retryTopicsShared(ctx context.Context, adm *kadm.Client, cfg Config) error {
	groups, err := adm.ListGroups(ctx)
	if err != nil {
		cfg.Logger.Debug("kscope: the consumer groups could not be listed to check that no other group shares this group's retry topics", "err", err)
		return nil
	}
	safe := retrytopic.SafeName(cfg.Group)
	for _, g := range groups.Groups() {
		if g != cfg.Group && retrytopic.SafeName(g) == safe {
			return fmt.Errorf("kscope: consumer group %q and group %q share their retry topics (%s.kscope-retry-*): each would handle the other's failed records. "+
				"Give this group an id that differs from the other's in its letters, digits, '.', '_' or '-' (or, to rename a group, delete the old one with "+
				"kafka-consumer-groups --delete once its retry topics are drained)", cfg.Group, g, safe)
		}
	}
	return nil
}

// Metadata returns the failure metadata rec carries (or, for a record on
// its first hop, its own coordinates and identity).
func (f *failures) Metadata(rec *Record) retrytopic.Metadata {
	return f.MetadataOf(rec, f.identity.Of(rec))
}

// MetadataOf is Metadata for a record whose identity id the caller has
// already computed.
func (f *failures) MetadataOf(rec *Record, id string) retrytopic.Metadata {
	m, _ := retrytopic.FromRecord(rec.Record, id)
	return m
}

// Policy returns the failure policy, with its defaults.
func (f *failures) Policy() retrytopic.Policy { return f.policy }

// produce writes out and waits for its acknowledgement, retrying with
// backoff; only a done ctx stops it.
// rt is the route reported to the hooks (its Target and Err are filled
// in).
func (f *failures) produce(ctx context.Context, rt hook.Route, out *kgo.Record) error {
	source := rt.Topic
	for attempt := 1; ; attempt++ {
		err := f.cl.ProduceSync(ctx, out).FirstErr()
		if ctx.Err() == nil {
			rt.Target, rt.Err = out.Topic, err
			f.obs.Route(rt)
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		f.dltErrors.Add(1)
		d := backoff.Delay(attempt, 100*time.Millisecond, 30*time.Second)
		switch {
		case kafkaerr.Fatal(err):
			// Only an operator heals it; the retries pick the grant up
			// without a restart.
			f.log.Error("kscope: the broker refuses this client writes to a failure topic; grant it write access to the topic. "+
				"The record's offset is held until the write succeeds", "topic", out.Topic, "err", err, "retry_in", d)
		case kafkaerr.Refused(err):
			// The record can neither be handled nor routed: holding its
			// key-shard loses nothing, and the retries pick a raised
			// limit up without a restart.
			f.log.Error("kscope: the broker refuses a failed record as too large or invalid for its route; raise the topic's max.message.bytes "+
				"(and kgo.ProducerBatchMaxBytes in Config.ClientOptions). The record's offset and key-shard are held until the write succeeds",
				"topic", out.Topic, "source", source, "err", err, "retry_in", d)
		default:
			f.log.Warn("kscope: producing a failed record to its route failed; the record's offset is held until it succeeds",
				"topic", out.Topic, "err", err, "retry_in", d)
		}
		if !backoff.Sleep(ctx, d) {
			return ctx.Err()
		}
	}
}

// ensureTopics checks that the dead-letter topic (and the retry topics,
// when used) exist and, unless the policy says not to, creates the missing
// ones with as many partitions as the largest source topic.
func (f *failures) ensureTopics(ctx context.Context, sources []string) error {
	adm := kadm.NewClient(f.cl)
	need := []string{f.policy.DeadLetterTopic}
	if f.topics {
		need = append(need, f.policy.RetryTopics()...)
	}
	td, err := adm.ListTopics(ctx, append(append([]string{}, need...), sources...)...)
	switch {
	case err != nil && ctx.Err() == nil && unreachable(err):
		return fmt.Errorf("%w: looking up the failure topics: no connection to the brokers %v could be opened (the start requests give up after %v); check Config.Brokers (host and port) and that the brokers run and this host can reach them: %w",
			ErrBrokersUnreachable, f.cl.OptValue(kgo.SeedBrokers), f.cl.OptValue(kgo.RetryTimeout), err)
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		return fmt.Errorf("%w: looking up the failure topics: SASL authentication failed; check the mechanism, user and password in Config.ClientOptions (kgo.SASL): %w", ErrBrokerSetup, err)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		// This is a runner's first request: a broker that hangs up on it
		// most often refused the client's TLS or SASL setup.
		return fmt.Errorf("%w: looking up the failure topics: the broker closed the connection; check the TLS and SASL settings in Config.ClientOptions (mechanism, user, password, CA): %w", ErrBrokerSetup, err)
	case err != nil && ctx.Err() == nil && usesTLS(f.cl):
		// A TLS client whose handshake gets no answer: most often the
		// listener speaks plaintext.
		return fmt.Errorf("%w: looking up the failure topics: no TLS connection to the brokers %v could be made; check that their listener speaks TLS (or remove kgo.DialTLSConfig from Config.ClientOptions for a plaintext listener): %w", ErrBrokerSetup, f.cl.OptValue(kgo.SeedBrokers), err)
	}
	if err != nil {
		return fmt.Errorf("kscope: looking up the failure topics: %w", err)
	}
	partitions := int32(1)
	for _, s := range sources {
		if d, ok := td[s]; ok && d.Err == nil {
			partitions = max(partitions, int32(len(d.Partitions)))
		} else if f.log != nil {
			f.log.Warn("kscope: an input topic does not exist; the runner consumes it once it is created. Create it, or check Config.Topics for a typo", "topic", s)
		}
	}
	for _, t := range need {
		if d, ok := td[t]; ok && d.Err == nil {
			continue
		}
		if f.policy.DoNotCreateTopics {
			return fmt.Errorf("kscope: the failure topic %s does not exist and Config.Failures.DoNotCreateTopics is set; create it, or unset DoNotCreateTopics", t)
		}
		resp, err := adm.CreateTopic(ctx, partitions, -1, f.policy.TopicConfigs(t), t)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("kscope: the failure topic %s does not exist and creating it failed (%w); create it yourself, or grant this client CREATE on the cluster", t, err)
		}
	}
	if d, ok := td[f.policy.DeadLetterTopic]; ok && d.Err == nil && f.log != nil {
		f.warnLimitedRetention(ctx, adm)
	}
	return nil
}

// warnLimitedRetention logs a warning when the dead-letter topic, which
// existed before, expires its records while the policy asks for unlimited
// retention: unresolved dead letters would vanish silently.
func (f *failures) warnLimitedRetention(ctx context.Context, adm *kadm.Client) {
	if f.policy.DeadLetterRetention > 0 {
		return
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, f.policy.DeadLetterTopic)
	if err != nil {
		return // the check is advisory
	}
	for _, rc := range rcs {
		for _, c := range rc.Configs {
			if c.Key == "retention.ms" && c.Value != nil && *c.Value != "-1" {
				f.log.Warn("kscope: the dead-letter topic expires its records; unresolved dead letters will be lost. Set retention.ms=-1 on it, or set Config.Failures.DeadLetterRetention to accept the limit",
					"dlt", f.policy.DeadLetterTopic, "retention_ms", *c.Value)
			}
		}
	}
}

// FailureStats are the failure policy's counters.
type FailureStats struct {
	Retries      int64 // in-place retries scheduled
	Skipped      int64 // records skipped as business outcomes
	DeadLettered int64 // records acknowledged by the dead-letter topic
	DLTErrors    int64 // failed produce attempts to the dead-letter or a retry topic
	RetryTopic   int64 // records sent to a retry topic after failing
	// DecodeFailures counts the records dead-lettered because their
	// payload could not be decoded (a retrytopic.DecodeFailure: a
	// codec's, or any consumer.DecodeError); they are in DeadLettered too
	// (in the Kafka scope, in Stats.Kafka.DeadLettered). The Kafka scope
	// counts one when its dead-letter record joins the transaction: a
	// transaction that aborts and is replayed counts it again.
	DecodeFailures int64
}

func (f *failures) stats() FailureStats {
	return FailureStats{
		Retries: f.retries.Load(), Skipped: f.skipped.Load(),
		DeadLettered: f.deadLettered.Load(), DLTErrors: f.dltErrors.Load(),
		RetryTopic: f.routed.Load(), DecodeFailures: f.decodeFailures.Load(),
	}
}

// undecodable counts rec as a decode failure and reports
// hook.EventDecodeFailure when err, that sends it to the dead-letter topic,
// is a retrytopic.DecodeFailure. The detail is the payload's format and
// schema id, never the payload.
func (f *failures) undecodable(rec *Record, err error) {
	d, ok := retrytopic.AsDecodeFailure(err)
	if !ok {
		return
	}
	f.decodeFailures.Add(1)
	detail := d.Format
	if detail == "" {
		detail = "payload"
	}
	if d.HasSchemaID {
		detail += " schema-id=" + strconv.Itoa(d.SchemaID)
	}
	f.obs.Event(rec, hook.EventDecodeFailure, detail)
}
