package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// shareResetUsage is share reset's synopsis, description and examples.
const shareResetUsage = `
Usage:
  kscope share reset --group G --topic T (--to-start | --to-end | --to-offset N | --to-time RFC3339) [--partition P]
                     [--dry-run] [--yes] [--approve NAME] [--force --reason "..."] [--max-scan N] [--database-url URL]

Moves the share-partition start offset of a share group with no members
on one topic (all its partitions, or --partition P alone). Moving it back
has the group's members given the records from there again (every one
of them, acknowledged before or not, with a delivery count from 1);
moving it forward archives the records below it: no member is given
them.

It first prints the blast radius: per partition the group's position
(its start offset or, where the broker reports how many records are not
yet acknowledged and the end offset minus those is ahead, that), the
target offset and how many records will be given again or skipped, and
the total, and for records given again, what replay prints of them (the
records read, their keys, their time range and, for a DB-scope consumer
with --database-url, the expected no-op rate). With --dry-run, or
without --yes, it stops there and changes nothing.

It follows the rules of 'kscope replay' (see 'kscope replay -h'): with a
policy file (--policy FILE, or $KSCOPE_POLICY), it refuses (exit status
2, nothing changed) a group whose entry says replay: false, a move back
of an at_least_once consumer without a dedupe store that outlives its
processes unless --force with a --reason, and a commit of a critical
consumer's move without --approve NAME. Every move it makes is first
appended to the audit log (--audit-topic, default kscope-audit), with
the action share-reset; 'kscope audit' lists it.

It refuses (exit status 2) a share group that does not exist, or that
has members: Kafka moves the start offsets of a share group only while
none is running. Stop its consumers first.

Targets:
  --to-offset N      offset N (kept within each partition's start and end)
  --to-time T        the first offset whose timestamp is at or after T
  --to-start         the oldest offset still in the log
  --to-end           the end of the log: archive everything not yet acknowledged

Examples:
  kscope share reset --group payments-workers --topic orders --to-time 2024-05-01T00:00:00Z
  kscope share reset --group payments-workers --topic orders --to-end --yes --approve alice --reason "poison backlog"
  kscope share reset --group payments-workers --topic orders --to-offset 1200 --partition 3 --yes
`

func shareResetCmd() *command {
	return &command{
		name:    "share reset",
		summary: "move a share group's start offsets on a topic while it has no members",
		usage:   shareResetUsage,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			o := &shareResetOpts{}
			brokers := brokerFlag(fs)
			fs.StringVar(&o.group, "group", "", "the share group (required)")
			fs.StringVar(&o.topic, "topic", "", "the topic whose start offsets to move (required)")
			fs.Int64Var(&o.toOffset, "to-offset", -1, "move to this offset")
			fs.StringVar(&o.toTime, "to-time", "", "move to the first record at or after this RFC 3339 time")
			fs.BoolVar(&o.toStart, "to-start", false, "move to the start of the log")
			fs.BoolVar(&o.toEnd, "to-end", false, "move to the end of the log")
			fs.IntVar(&o.partition, "partition", -1, "move this partition alone (default: every partition of the topic)")
			fs.BoolVar(&o.dryRun, "dry-run", false, "print the blast radius and change nothing")
			fs.BoolVar(&o.yes, "yes", false, "move the start offsets (without it, only the blast radius is printed)")
			fs.BoolVar(&o.asJSON, "json", false, "print the plan and the outcome as one JSON object")
			o.timeouts = timeoutFlags(fs)
			o.safetyFlags(fs)
			return func(ctx context.Context) error {
				o.brokers = *brokers
				return shareReset(ctx, e, o)
			}
		},
	}
}

// shareResetOpts are replay's options and --partition.
type shareResetOpts struct {
	replayOpts
	partition int
}

// shareReset runs share reset: it checks the flags, prints the plan and
// its blast radius, and with --yes audits the move and makes it.
func shareReset(ctx context.Context, e *env, o *shareResetOpts) error {
	return runMove(ctx, e, &o.replayOpts, offsetMove{
		usage: "give the share group with --group and the topic with --topic",
		plan: func(ctx context.Context, kc *kafkaConn, adm *kadm.Client, at time.Time) (map[int32]*replayPlan, error) {
			return planShareReset(ctx, kc, adm, o, at)
		},
		print: func(desc string, plan map[int32]*replayPlan, rep *replayReport) {
			printShareReset(e.stdout, o, desc, plan, rep)
		},
		finish: func(ctx context.Context, kc *kafkaConn, adm *kadm.Client, plan map[int32]*replayPlan, rep *replayReport) error {
			return finishShareReset(ctx, e, kc, adm, o, plan, rep)
		},
	})
}

// planShareReset checks that the topic and its partition exist and the
// group has no members, and returns each partition's move.
func planShareReset(ctx context.Context, kc *kafkaConn, adm *kadm.Client, o *shareResetOpts, at time.Time) (map[int32]*replayPlan, error) {
	n, err := topicExists(ctx, adm, kc, o.topic, "check --topic")
	if err != nil {
		return nil, err
	}
	if o.partition >= n || o.partition < -1 {
		return nil, usagef("topic %s has no partition %d: it has %s", o.topic, o.partition, plural(n, "partition"))
	}
	if err := shareGroupStopped(ctx, kc, adm, o.group); err != nil {
		return nil, err
	}
	var plan map[int32]*replayPlan
	err = kc.do(ctx, retrying(func(ctx context.Context) (err error) {
		plan, err = logTargets(ctx, adm, &o.replayOpts, at, func(ctx context.Context) (map[int32]int64, error) { return shareStarts(ctx, adm, o.group, o.topic) })
		return err
	}))
	if err != nil {
		return nil, err
	}
	if o.partition >= 0 {
		plan = map[int32]*replayPlan{int32(o.partition): plan[int32(o.partition)]}
	}
	return plan, nil
}

// shareGroupStopped returns a refusal unless group is a share group with
// no members.
func shareGroupStopped(ctx context.Context, kc *kafkaConn, adm *kadm.Client, group string) error {
	d := &shareDescription{Group: group}
	if err := kc.do(ctx, retrying(func(ctx context.Context) error { return d.readGroup(ctx, adm) })); err != nil {
		return refusef("%v; nothing was changed", err)
	}
	if len(d.Members) > 0 {
		var ms []string
		for _, m := range d.Members {
			ms = append(ms, m.ClientID+"@"+m.Host)
		}
		return refusef("refused: share group %q has members (state %s, %s: %s): Kafka moves a share group's start offsets only while none is running; stop its consumers first, then re-run; nothing was changed",
			group, d.State, plural(len(ms), "member"), strings.Join(ms, ", "))
	}
	return nil
}

// shareStarts returns where group is on each partition of topic it has
// started: its share-partition start offset or, where the broker reports
// its lag and the end offset minus the lag is ahead of it, that (Apache
// Kafka reports a start offset that moves past acknowledged records only
// now and then; with the group stopped, the lag is the records left to
// deliver).
func shareStarts(ctx context.Context, adm *kadm.Client, group, topic string) (map[int32]int64, error) {
	offs, err := adm.DescribeShareGroupOffsets(ctx, group)
	if err == nil {
		err = offs[group].Err
	}
	if err != nil {
		return nil, fmt.Errorf("describing the start offsets of share group %q: %w", group, err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing the end offsets of %q: %w", topic, err)
	}
	starts := map[int32]int64{}
	for p, so := range offs[group].Offsets[topic] {
		if so.Err != nil || so.StartOffset < 0 {
			continue
		}
		starts[p] = so.StartOffset
		if end, ok := ends.Lookup(topic, p); ok && so.Lag >= 0 && end.Offset-so.Lag > so.StartOffset {
			starts[p] = end.Offset - so.Lag
		}
	}
	return starts, nil
}

// printShareReset writes the plan, the blast radius and what the policy
// says of it.
func printShareReset(w io.Writer, o *shareResetOpts, desc string, plan map[int32]*replayPlan, rep *replayReport) {
	fmt.Fprintf(w, "share reset: group %s, topic %s, to %s\n", o.group, o.topic, desc)
	if rep.Policy != "" {
		fmt.Fprintln(w, rep.Policy)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tPOSITION\tTARGET\tEFFECT")
	for _, p := range sortedPartitions(plan) {
		pl := plan[p]
		target := fmt.Sprint(pl.target)
		if pl.clamped {
			target += " (clamped)"
		}
		start, effect := fmt.Sprint(pl.committed), "unchanged"
		switch {
		case pl.committed < 0:
			start, effect = "none", "not started by the group yet: will start at the target"
		case pl.target < pl.committed:
			effect = plural64(pl.committed-pl.target, "record") + " given again"
		case pl.target > pl.committed:
			effect = plural64(pl.target-pl.committed, "record") + " skipped (archived)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", p, start, target, effect)
	}
	tw.Flush()
	fmt.Fprintf(w, "total: %s given again, %s skipped\n", plural64(rep.Again, "record"), plural64(rep.Skipped, "record"))
	fmt.Fprintln(w, "(position: the share-partition start offset, or the end offset minus the records not yet acknowledged where the broker reports them and that is ahead)")
	if rep.Blast != nil {
		rep.Blast.print(w)
	}
}

// finishShareReset stops at the plan (nothing to do, --dry-run, no
// --yes), or audits the move and makes it.
func finishShareReset(ctx context.Context, e *env, kc *kafkaConn, adm *kadm.Client, o *shareResetOpts, plan map[int32]*replayPlan, rep *replayReport) error {
	ro := &o.replayOpts
	switch {
	case rep.Changes == 0:
		rep.say(e, ro, "nothing to do: every partition is already at its target")
		return nil
	case o.dryRun:
		rep.say(e, ro, "dry run: nothing changed")
		return nil
	case !o.yes:
		rep.say(e, ro, "nothing changed: re-run with --yes to move these start offsets (keep the group's consumers stopped until then)")
		return nil
	}
	if err := shareGroupStopped(ctx, kc, adm, o.group); err != nil {
		return err
	}
	if err := auditAction(ctx, e, kc, adm, ro, rep, "share-reset"); err != nil {
		return err
	}
	offsets := make(kadm.Offsets)
	for p, pl := range plan {
		if pl.committed != pl.target {
			offsets.Add(kadm.Offset{Topic: o.topic, Partition: p, At: pl.target, LeaderEpoch: -1})
		}
	}
	var resp kadm.AlterShareGroupOffsetsResponses
	err := kc.do(ctx, func(ctx context.Context) (err error) {
		resp, err = adm.AlterShareGroupOffsets(ctx, o.group, offsets)
		return err
	})
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("moving the start offsets of share group %q failed: %w; nothing or part was changed: check with --dry-run and re-run (the audit log's entry %s records the attempt)",
			o.group, err, rep.Audit)
	}
	rep.Committed = true
	rep.say(e, ro, fmt.Sprintf("moved: share group %s will start topic %s at the target offsets on %s when its consumers start; audit log entry %s in %s",
		o.group, o.topic, plural(len(offsets[o.topic]), "partition"), rep.Audit, o.auditTopic))
	return nil
}
