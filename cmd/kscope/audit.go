package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// defaultAuditTopic is the topic the audit log is kept in (--audit-topic).
const defaultAuditTopic = "kscope-audit"

// auditRecord is one action in the audit log: one JSON record, keyed by
// its id, in the compacted audit topic.
type auditRecord struct {
	ID     string    `json:"id"`
	Action string    `json:"action"` // replay, share-reset, dlt-redrive-edited, dlt-skip, dlt-delete
	At     time.Time `json:"at"`
	// ApprovedBy is --approve: who approved the action.
	ApprovedBy string `json:"approved_by,omitempty"`
	// Operator is who ran the command ($USER).
	Operator string `json:"operator,omitempty"`
	Group    string `json:"group"`
	Topic    string `json:"topic"`
	// What is the action's target, as the plan says it.
	What   string `json:"what"`
	Reason string `json:"reason,omitempty"`
	// Forced says that --force overrode a refusal (the reason says why).
	Forced bool `json:"forced,omitempty"`
	// Policy is what the policy file says of the group.
	Policy  string       `json:"policy,omitempty"`
	Ranges  []auditRange `json:"ranges"`
	Again   int64        `json:"records_consumed_again"`
	Skipped int64        `json:"records_skipped"`
	Blast   *blastRadius `json:"blast_radius,omitempty"`
	// DeadLetters are the dead letters a triage action (dlt skip, dlt
	// delete, dlt redrive --payload-file) handled, by identity.
	DeadLetters []auditDeadLetter `json:"dead_letters,omitempty"`
	// Payload is an edited redrive's original and edited values.
	Payload *auditPayload `json:"payload,omitempty"`
}

// auditDeadLetter is one dead letter a triage action handled: where it is
// in the dead-letter topic, its identity and its key (as dlt list shows
// it); never its value.
type auditDeadLetter struct {
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	ID        string `json:"id"`
	Key       string `json:"key"`
}

// auditPayload keeps both values of an edited redrive, base64 in JSON.
type auditPayload struct {
	Original []byte `json:"original_value"`
	Edited   []byte `json:"edited_value"`
}

// auditRange is one partition's move: the offsets from committed (-1:
// none) to target.
type auditRange struct {
	Partition int32 `json:"partition"`
	Committed int64 `json:"committed"`
	Target    int64 `json:"target"`
}

// newAuditID returns a unique id for an audit record.
func newAuditID(at time.Time) string {
	var b [6]byte
	rand.Read(b[:]) //nolint:errcheck // crypto/rand.Read does not fail
	return at.UTC().Format("20060102T150405.000Z") + "-" + hex.EncodeToString(b[:])
}

// writeAudit creates the audit topic when it does not exist (one
// partition, compacted: every record has its own key, so compaction
// deletes none and no retention expires them) and appends rec to it.
func writeAudit(ctx context.Context, kc *kafkaConn, adm *kadm.Client, topic string, rec *auditRecord) error {
	err := kc.do(ctx, func(ctx context.Context) error {
		compact := "compact"
		resp, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": &compact}, topic)
		if err == nil {
			err = resp.Err
		}
		if errors.Is(err, kerr.TopicAlreadyExists) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating the audit topic %s: %w", topic, err)
	}
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	cl, err := kc.client(kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		return err
	}
	defer cl.Close()
	err = kc.do(ctx, func(ctx context.Context) error {
		return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(rec.ID), Value: v, Timestamp: rec.At}).FirstErr()
	})
	if err != nil {
		return fmt.Errorf("writing to the audit topic %s: %w", topic, err)
	}
	return nil
}

// auditUsage is audit's synopsis, description and examples.
const auditUsage = `
Usage:
  kscope audit [--group G] [--audit-topic T] [--json]

Lists the audit log: one entry per replay that kscope replay committed,
per move of a share group's start offsets (kscope share reset), and per
triage action of a dead-letter topic (dlt redrive --payload-file,
dlt skip, dlt delete), oldest first, with who approved it (--approve), who ran it, when, the
group, the topic, the target, the reason, whether --force overrode a
refusal, and the offsets each partition moved from and to (for a triage
action, the dead letters it handled: partition/offset(identity)). The log
is the compacted topic kscope-audit (--audit-topic), which the first
audited command creates. With --json, an edited redrive's entry holds the
original and the edited value (payload.original_value, edited_value,
base64).

Examples:
  kscope audit
  kscope audit --group payments --json
`

func auditCmd() *command {
	return &command{
		name:    "audit",
		summary: "list the audit log: who approved which replay or dead-letter triage, when, why",
		usage:   auditUsage,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			brokers := brokerFlag(fs)
			group := fs.String("group", "", "list only the entries of this consumer group")
			topic := fs.String("audit-topic", defaultAuditTopic, "the audit log's topic")
			asJSON := fs.Bool("json", false, "print one JSON object per line")
			to := timeoutFlags(fs)
			return func(ctx context.Context) error {
				recs, err := readAudit(ctx, e, *brokers, *topic, *group, to)
				if err != nil {
					return err
				}
				return printAudit(e, *topic, recs, *asJSON)
			}
		},
	}
}

// readAudit reads the audit topic's entries, of group when not "".
func readAudit(ctx context.Context, e *env, brokers, topic, group string, to *timeouts) ([]auditRecord, error) {
	kc, cl, adm, err := e.kafkaAdmin(brokers, to)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	if _, err := topicExists(ctx, adm, kc, topic, "no replay was audited yet, or check --audit-topic"); err != nil {
		return nil, err
	}
	var recs []auditRecord
	_, err = scan(ctx, kc, adm, topic, scanRange{partition: -1, from: -1, to: -1, idle: defaultIdleTimeout}, func(r *kgo.Record) error {
		var a auditRecord
		if err := json.Unmarshal(r.Value, &a); err != nil {
			fmt.Fprintf(e.stderr, "warning: %s partition %d offset %d is not an audit record: %v\n", topic, r.Partition, r.Offset, err)
			return nil
		}
		if group == "" || a.Group == group {
			recs = append(recs, a)
		}
		return nil
	})
	return recs, err
}

// printAudit writes the entries as a table, or as JSON lines.
func printAudit(e *env, topic string, recs []auditRecord, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		for _, r := range recs {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	if len(recs) == 0 {
		fmt.Fprintf(e.stdout, "no entries in %s\n", topic)
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tACTION\tGROUP\tTOPIC\tWHAT\tAPPROVED BY\tOPERATOR\tFORCED\tREASON\tRANGES")
	for _, r := range recs {
		var ranges []string
		for _, rg := range r.Ranges {
			ranges = append(ranges, fmt.Sprintf("%d:%d->%d", rg.Partition, rg.Committed, rg.Target))
		}
		for _, d := range r.DeadLetters {
			ranges = append(ranges, fmt.Sprintf("%d/%d(%s)", d.Partition, d.Offset, d.ID))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%v\t%s\t%s\n", r.At.UTC().Format(time.RFC3339), r.Action, r.Group, r.Topic, r.What,
			dash(r.ApprovedBy), dash(r.Operator), r.Forced, dash(r.Reason), strings.Join(ranges, " "))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
