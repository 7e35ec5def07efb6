package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Failures applies a runner's failure policy (Config.Failures): it
// classifies a handler error, decides between a retry, a skip and the
// dead-letter topic, and produces dead-letter records. Scopes receive it
// through [FailureAware]; handlers never see it.
type Failures struct {
	policy   retrytopic.Policy
	group    string
	identity Identity
	cl       *kgo.Client
	log      *slog.Logger

	skipped, deadLettered, dltErrors, retries atomic.Int64
}

// FailureAware is implemented by a Scope that routes failures itself (the
// DB scope): the runner hands it the runner's Failures when Run starts.
type FailureAware interface {
	UseFailures(*Failures)
}

// Class classifies err under the policy.
func (f *Failures) Class(err error) Class { return f.policy.ClassOf(err) }

// Handle decides what follows a failed attempt of rec, counting attempts made
// on earlier hops (from rec's headers) plus attempt, those made here. For a
// skip it logs and counts; for the dead-letter topic it produces the record
// with its failure metadata and waits for the broker's acknowledgement,
// retrying the produce with backoff until it succeeds or ctx is done (then
// it returns ctx's error and the record is not done). firstFailure is when
// this record first failed here.
func (f *Failures) Handle(ctx context.Context, rec *Record, err error, attempt int, firstFailure time.Time) (retrytopic.Step, error) {
	meta, herr := retrytopic.FromRecord(rec.Record, f.identity.Of(rec))
	if herr != nil {
		f.log.LogAttrs(ctx, slog.LevelWarn, "kscope: record carries corrupt kscope headers; ignoring them", recordAttrs(rec, attempt, herr, 0)...)
	}
	total := min(meta.Attempt+attempt, retrytopic.MaxAttempt)
	step := f.policy.Next(f.policy.ClassOf(err), total)
	switch step.Action {
	case retrytopic.ActionSkip:
		f.skipped.Add(1)
		f.log.LogAttrs(ctx, slog.LevelInfo, "kscope: record skipped (business outcome)", recordAttrs(rec, total, err, 0)...)
	case retrytopic.ActionRetry:
		f.retries.Add(1)
		f.log.LogAttrs(ctx, levelForAttempt(attempt), "kscope: handler failed; retrying in place",
			append(recordAttrs(rec, total, err, step.Delay), slog.String("class", step.Class.String()))...)
	case retrytopic.ActionDeadLetter:
		now := time.Now()
		meta.Group = f.group
		meta.Attempt = total
		if meta.FirstFailure.IsZero() {
			meta.FirstFailure = firstFailure
		}
		meta.LastFailure = now
		meta.Error = err.Error()
		meta.Class = step.Class
		meta.Due, meta.Stage, meta.Parked = time.Time{}, -1, false
		out := &kgo.Record{
			Topic:   f.policy.DeadLetterTopic,
			Key:     rec.Key,
			Value:   rec.Value,
			Headers: meta.Headers(rec.Headers, f.policy.SpringHeaders),
		}
		if err := f.produce(ctx, out); err != nil {
			return step, err
		}
		f.deadLettered.Add(1)
		f.log.LogAttrs(ctx, slog.LevelError, "kscope: record sent to the dead-letter topic",
			append(recordAttrs(rec, total, err, 0), slog.String("class", step.Class.String()), slog.String("dlt", out.Topic))...)
	}
	return step, nil
}

// produce writes out and waits for its acknowledgement, retrying with
// backoff; only a done ctx stops it.
func (f *Failures) produce(ctx context.Context, out *kgo.Record) error {
	for attempt := 1; ; attempt++ {
		err := f.cl.ProduceSync(ctx, out).FirstErr()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		f.dltErrors.Add(1)
		d := backoff.Delay(attempt, 100*time.Millisecond, 30*time.Second)
		f.log.Warn("kscope: producing to the dead-letter topic failed; the record's offset is held until it succeeds",
			"topic", out.Topic, "err", err, "retry_in", d)
		if !backoff.Sleep(ctx, d) {
			return ctx.Err()
		}
	}
}

// ensureTopics checks that the dead-letter topic exists and, unless the
// policy says not to, creates it with as many partitions as the largest
// source topic.
func (f *Failures) ensureTopics(ctx context.Context, sources []string) error {
	adm := kadm.NewClient(f.cl)
	dlt := f.policy.DeadLetterTopic
	td, err := adm.ListTopics(ctx, append([]string{dlt}, sources...)...)
	if err != nil {
		return fmt.Errorf("kscope: looking up the dead-letter topic %s: %w", dlt, err)
	}
	if d, ok := td[dlt]; ok && d.Err == nil {
		return nil
	}
	if f.policy.DoNotCreateTopics {
		return fmt.Errorf("kscope: the dead-letter topic %s does not exist and Config.Failures.DoNotCreateTopics is set; create it, or unset DoNotCreateTopics", dlt)
	}
	partitions := int32(1)
	for _, s := range sources {
		if d, ok := td[s]; ok && d.Err == nil {
			partitions = max(partitions, int32(len(d.Partitions)))
		}
	}
	resp, err := adm.CreateTopic(ctx, partitions, -1, nil, dlt)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("kscope: the dead-letter topic %s does not exist and creating it failed (%w); create it yourself, or grant this client CREATE on the cluster", dlt, err)
	}
	return nil
}

// FailureStats are the failure policy's counters.
type FailureStats struct {
	Retries      int64 // in-place retries scheduled
	Skipped      int64 // records skipped as business outcomes
	DeadLettered int64 // records acknowledged by the dead-letter topic
	DLTErrors    int64 // failed produce attempts to the dead-letter topic
}

func (f *Failures) stats() FailureStats {
	return FailureStats{
		Retries: f.retries.Load(), Skipped: f.skipped.Load(),
		DeadLettered: f.deadLettered.Load(), DLTErrors: f.dltErrors.Load(),
	}
}
