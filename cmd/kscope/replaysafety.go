package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/policy"
)

// safetyFlags declares the flags of replay's safety checks: the override
// of a refusal, the approval, the blast radius's bound, the inbox look-up
// and the audit log.
func (o *replayOpts) safetyFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.force, "force", false, "replay an at_least_once consumer that has no dedupe store (needs --reason; audited)")
	fs.StringVar(&o.reason, "reason", "", "why the replay may go ahead: recorded in the audit log (required with --force)")
	fs.StringVar(&o.approve, "approve", "", "who approved the replay (`NAME`): recorded in the audit log; required for a critical consumer")
	fs.IntVar(&o.maxScan, "max-scan", defaultMaxScan, "read at most this many records to measure the blast radius (past it, the counts are lower bounds)")
	o.databaseURL = databaseFlag(fs)
	o.tablePrefix = tablePrefixFlag(fs)
	fs.StringVar(&o.inboxConsumer, "inbox-consumer", "", "a DB-scope consumer's name in its inbox (dbscope.Options.Consumer; default the group)")
	fs.StringVar(&o.idHeader, "id-header", consumer.DefaultMessageIDHeader, "the header the records carry their identity in (consumer.Config.Identity.Header)")
	fs.StringVar(&o.auditTopic, "audit-topic", defaultAuditTopic, "the audit log's topic (compacted; created with its first entry)")
}

// checkSafetyFlags checks the safety flags' values.
func (o *replayOpts) checkSafetyFlags() error {
	switch {
	case o.force && strings.TrimSpace(o.reason) == "":
		return usagef(`--force needs --reason "...": say why the records' effects may run again; the reason is recorded in the audit log`)
	case o.maxScan < 1:
		return usagef("--max-scan must be 1 or more, got %d", o.maxScan)
	case strings.TrimSpace(o.auditTopic) == "":
		return usagef("--audit-topic is empty; give the audit log's topic (default %s)", defaultAuditTopic)
	}
	return nil
}

// replayPolicy is what the policy file says of the group a replay moves.
type replayPolicy struct {
	path  string
	note  string           // printed under the plan ("" without a file)
	entry *policy.Consumer // nil: no file, or no entry for the group
}

// gate refuses a replay the policy does not let go ahead as given: an
// at_least_once consumer without a lasting dedupe store, moved back,
// unless forced; a critical consumer's commit without an approver. It
// records an override in rep.
func (pol replayPolicy) gate(o *replayOpts, rep *replayReport) error {
	c := pol.entry
	if c == nil {
		return nil
	}
	if rep.Again > 0 && !c.ReplayDeduped() {
		if !o.force {
			store := "declares no dedupe store"
			if c.Dedupe != "" {
				store = "says dedupe: " + string(c.Dedupe)
			}
			return refusef("refused: consumer group %s runs in the at_least_once scope without a dedupe store that outlives its processes (the policy %s %s): "+
				"the replay would run its handler again for %s, and their effects would happen twice; nothing was changed. "+
				`Re-run with --force --reason "..." to replay anyway (the replay is audited), or declare the store the consumer runs with (dedupe: redis or postgres).`,
				o.group, pol.path, store, plural64(rep.Again, "record"))
		}
		rep.Forced = true
	}
	if c.Critical && o.yes && !o.dryRun && rep.Changes > 0 && strings.TrimSpace(o.approve) == "" {
		return refusef("refused: the policy %s says critical: true for consumer group %s (owned by %s, %s): its replay needs an approver; nothing was changed. "+
			"Re-run with --approve NAME, naming who approved it: it is recorded in the audit log, which 'kscope audit' lists.",
			pol.path, o.group, c.Owner.Team, c.Owner.Contact)
	}
	return nil
}

// blast measures the blast radius of the plan and, for a DB-scope
// consumer with a database, its expected no-op rate.
func (o *replayOpts) blast(ctx context.Context, e *env, kc *kafkaConn, adm *kadm.Client, plan map[int32]*replayPlan, c *policy.Consumer) (*blastRadius, error) {
	var db *dbConn
	note := ""
	if c != nil && c.Scope == policy.ScopeDB {
		if strings.TrimSpace(*o.databaseURL) == "" && strings.TrimSpace(e.getenv("DATABASE_URL")) == "" {
			note = "unknown: give --database-url (or DATABASE_URL) to look the records up in the consumer's inbox"
		} else {
			var err error
			if db, err = e.database(*o.databaseURL, o.timeouts); err != nil {
				return nil, err
			}
			defer db.Close()
		}
	}
	var idOf = identityOf(o.idHeader)
	if db == nil {
		idOf = nil
	}
	b, err := measureBlast(ctx, kc, adm, o, plan, idOf)
	if err != nil {
		return nil, err
	}
	b.NoOpNote = note
	if db != nil {
		name := o.inboxConsumer
		if name == "" {
			name = o.group
		}
		if b.NoOp, err = lookUpInbox(ctx, db, *o.tablePrefix, name, b); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// audit appends the replay to the audit log, before its offsets are
// committed: a replay that could not be audited is not made.
func (o *replayOpts) audit(ctx context.Context, e *env, kc *kafkaConn, adm *kadm.Client, rep *replayReport) error {
	return auditAction(ctx, e, kc, adm, o, rep, "replay")
}

// auditAction appends a move of offsets (replay, share-reset) to the
// audit log, and records its id in rep.
func auditAction(ctx context.Context, e *env, kc *kafkaConn, adm *kadm.Client, o *replayOpts, rep *replayReport, action string) error {
	at := time.Now().UTC()
	rec := &auditRecord{ID: newAuditID(at), Action: action, At: at, ApprovedBy: strings.TrimSpace(o.approve), Operator: e.getenv("USER"),
		Group: o.group, Topic: o.topic, What: rep.Target, Reason: strings.TrimSpace(o.reason), Forced: rep.Forced, Policy: rep.Policy,
		Ranges: []auditRange{}, Again: rep.Again, Skipped: rep.Skipped, Blast: rep.Blast}
	for _, p := range rep.Partitions {
		if p.Committed != p.Target {
			rec.Ranges = append(rec.Ranges, auditRange{Partition: p.Partition, Committed: p.Committed, Target: p.Target})
		}
	}
	if err := writeAudit(ctx, kc, adm, o.auditTopic, rec); err != nil {
		return fmt.Errorf("%w; the %s is not made unaudited, so nothing was changed", err, action)
	}
	rep.Audit = rec.ID
	return nil
}
