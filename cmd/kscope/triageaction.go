package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// Audit actions of the triage commands.
const (
	actionRedriveEdited = "dlt-redrive-edited"
	actionSkip          = "dlt-skip"
	actionDelete        = "dlt-delete"
)

// triageFlags are the flags of a triage action on dead letters (an
// edited redrive, a skip, a delete): why, who approved it, and the audit
// log it is recorded in.
type triageFlags struct {
	reason     string
	approve    string
	auditTopic string
}

// declare declares the flags on fs; what names the action in their help.
func (t *triageFlags) declare(fs *flag.FlagSet, what string) {
	fs.StringVar(&t.reason, "reason", "", "why "+what+": recorded in the audit log (required)")
	fs.StringVar(&t.approve, "approve", "", "who approved "+what+" (`NAME`): recorded in the audit log")
	fs.StringVar(&t.auditTopic, "audit-topic", defaultAuditTopic, "the audit log's topic (compacted; created with its first entry)")
}

// check requires a reason and an audit topic.
func (t *triageFlags) check(what string) error {
	switch {
	case strings.TrimSpace(t.reason) == "":
		return usagef(`say why with --reason "...": the reason of %s is recorded in the audit log`, what)
	case strings.TrimSpace(t.auditTopic) == "":
		return usagef("--audit-topic is empty; give the audit log's topic (default %s)", defaultAuditTopic)
	}
	return nil
}

// deadLetter is one record of a dead-letter topic a triage action chose,
// with its decoded metadata.
type deadLetter struct {
	r *kgo.Record
	m retrytopic.Metadata
}

func (d deadLetter) audit() auditDeadLetter {
	return auditDeadLetter{Partition: d.r.Partition, Offset: d.r.Offset, ID: d.m.ID, Key: keyText(d.r.Key)}
}

// newTriageAudit returns the audit record of a triage action of group on
// its dead-letter topic, listing the dead letters it handles.
func newTriageAudit(e *env, action, group, topic, what string, t *triageFlags, dls []deadLetter) *auditRecord {
	at := time.Now().UTC()
	rec := &auditRecord{ID: newAuditID(at), Action: action, At: at, ApprovedBy: strings.TrimSpace(t.approve), Operator: e.getenv("USER"),
		Group: group, Topic: topic, What: what, Reason: strings.TrimSpace(t.reason), Ranges: []auditRange{}}
	for _, d := range dls {
		rec.DeadLetters = append(rec.DeadLetters, d.audit())
	}
	return rec
}

// auditTopicExists reports whether the audit log's topic exists.
func auditTopicExists(ctx context.Context, kc *kafkaConn, adm *kadm.Client, topic string) (bool, error) {
	var tds kadm.TopicDetails
	if err := kc.do(ctx, func(ctx context.Context) (err error) { tds, err = adm.ListTopics(ctx, topic); return err }); err != nil {
		return false, err
	}
	td, ok := tds[topic]
	return ok && td.Err == nil, nil
}

// readResolved returns the identities of group's dead letters that the
// audit log says kscope dlt skip resolved, each with the id of the audit
// record that did; none when the log does not exist yet.
func readResolved(ctx context.Context, kc *kafkaConn, adm *kadm.Client, auditTopic, group string) (map[string]string, error) {
	out := map[string]string{}
	ok, err := auditTopicExists(ctx, kc, adm, auditTopic)
	if err != nil || !ok {
		return out, err
	}
	_, err = scan(ctx, kc, adm, auditTopic, scanRange{partition: -1, from: -1, to: -1, idle: defaultIdleTimeout}, func(r *kgo.Record) error {
		var a auditRecord
		if json.Unmarshal(r.Value, &a) != nil || a.Action != actionSkip || a.Group != group {
			return nil
		}
		for _, d := range a.DeadLetters {
			out[d.ID] = a.ID
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the skipped dead letters from the audit log %s: %w", auditTopic, err)
	}
	return out, nil
}

// triagePass reads topic's partitions in rng (from their start: rng's
// offsets are not used) and hands each record to visit, which reports
// whether the action handles it. It returns the triage run of group's
// triage group (retrytopic.TriageGroup) over what visit handled, to commit
// once the action is done, and whether the read reached every partition's
// end.
func triagePass(ctx context.Context, kc *kafkaConn, adm *kadm.Client, group, topic string, rng scanRange,
	visit func(r *kgo.Record, m retrytopic.Metadata, derr error) bool) (*triage, bool, error) {
	rng.from, rng.to = -1, -1
	tr, err := newTriage(ctx, adm, kc, group, topic, rng)
	if err != nil {
		return nil, false, err
	}
	if tr.bounds, err = bounds(ctx, adm, kc, topic, rng); err != nil {
		return nil, false, err
	}
	held, err := scan(ctx, kc, adm, topic, rng, func(r *kgo.Record) error {
		m, derr := decode(r)
		tr.saw(r, visit(r, m, derr))
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return tr, len(held) == 0, nil
}

// commitPass commits the triage run of an action, and says on stderr
// which partitions no longer wait up to which offset.
func commitPass(ctx context.Context, e *env, kc *kafkaConn, adm *kadm.Client, cmd, topic string, tr *triage, complete bool) error {
	done, err := tr.commit(ctx, adm, kc, topic, complete)
	for _, p := range sortedPartitions(done) {
		fmt.Fprintf(e.stderr, "%s: committed partition %d offset %d under group %s: the dead letters before it no longer wait\n", cmd, p, done[p], tr.group)
	}
	return err
}
