package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// replayUsage is replay's synopsis, description and examples.
const replayUsage = `
Usage:
  kscope replay --group G --topic T (--to-offset N | --to-time RFC3339 | --to-start | --to-end) [--dry-run] [--yes]
                [--approve NAME] [--force --reason "..."] [--max-scan N] [--database-url URL]

Resets the committed offsets of a STOPPED consumer group for one topic, so
that its consumers, when started again, re-consume records (moving back) or
skip them (moving forward).

It first prints the blast radius: per partition the committed offset, the
target offset and how many records will be consumed again or skipped, and
the total. Counts are offset differences (transaction markers count too).
When records are consumed again, it reads them (at most --max-scan, past
which the counts are lower bounds) and prints how many there are, their
distinct keys and the time range of their timestamps; for a DB-scope
consumer (policy scope db) with --database-url or $DATABASE_URL, also the
expected no-op rate: how many of them the consumer's inbox holds already
(their identities, as consumer.Identity computes them with --id-header,
under the consumer's name, --inbox-consumer). With --dry-run, or without
--yes, it stops there and changes nothing.

With a policy file (--policy FILE, or $KSCOPE_POLICY), it refuses (exit
status 2, nothing changed):
  - a group whose entry says replay: false, before it talks to Kafka;
  - a move back of an at_least_once consumer whose entry declares no dedupe
    store that outlives its processes (dedupe: redis or postgres), unless
    --force with a --reason;
  - a commit (--yes) of a consumer whose entry says critical: true without
    --approve NAME.
It prints what the entry says of a group it allows.

Every replay it commits is first appended to the audit log, the compacted
topic kscope-audit (--audit-topic): who approved it (--approve), who ran it
($USER), when, the group, topic and target, the reason, whether --force
overrode a refusal, each partition's offsets before and after, and the
blast radius. A replay the log cannot take is not made. 'kscope audit'
lists the log.

It refuses when the group does not exist, when the group still has members
(stop its consumers first: Kafka rejects offsets committed from outside a
running group, and a running consumer would overwrite them), or when the
topic does not exist.

The counts are of records the group's consumers will be given again, not
of records handled again; that depends on the group's scope, and a replay
that moves back prints it under the plan:

  at-least-once  the handler runs again for each record.
  DB scope       a record whose inbox row is kept is a no-op: its first
                 outcome stands (applied, skipped, stale, parked or
                 dead-lettered: 'kscope dlt redrive' runs a dead-lettered
                 one again, a replay does not). Records whose inbox rows
                 Options.InboxTTL deleted are applied again (with
                 Options.Versions, stale when their version is at or below
                 their key's last). With Options.StoreOffsets the runner
                 resumes each partition from the position stored in
                 PostgreSQL when it is ahead of the committed offset: it
                 consumes none of the replayed records below that position,
                 not even those it never applied (skipped by an earlier
                 replay forward). To have them consumed, delete the
                 consumer's stored positions of the topic while the group
                 is stopped:
                   DELETE FROM <prefix>offsets WHERE consumer = '<consumer>'
                     AND topic = '<topic>'
                 (<prefix>: Options.TablePrefix, kscope_ by default;
                 <consumer>: Options.Consumer, the group id by default); the
                 inbox still deduplicates what they would have skipped.
  Kafka scope    the outputs are produced again (a read_committed reader
                 sees them a second time), except for records whose version
                 (Options.Versions) is at or below their key's last in the
                 changelog: those are stale and produce nothing.

Targets:
  --to-offset N      offset N on every partition (kept within each partition's
                     start and end)
  --to-time T        the first offset whose timestamp is at or after T, such as
                     2024-05-01T00:00:00Z (the end when there is none)
  --to-start         the oldest offset still in the log
  --to-end           the end of the log: skip everything not consumed yet

Examples:
  kscope replay --group payments --topic orders --to-time 2024-05-01T00:00:00Z
  kscope replay --group payments --topic orders --to-time 2024-05-01T00:00:00Z --yes
  kscope replay --group payments --topic orders --to-start --dry-run
  kscope replay --group payments --topic orders --to-end --yes
  kscope replay --group ledger --topic orders --to-start --yes --approve alice --database-url "$DATABASE_URL"
  kscope replay --group emails --topic signups --to-start --yes --force --reason "the mailer was down; resend" --approve bob
`

func replayCmd() *command {
	return &command{
		name:    "replay",
		summary: "move a stopped consumer group's committed offsets on a topic",
		usage:   replayUsage,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			o := &replayOpts{}
			brokers := brokerFlag(fs)
			fs.StringVar(&o.group, "group", "", "the consumer group (required)")
			fs.StringVar(&o.topic, "topic", "", "the topic whose committed offsets to move (required)")
			fs.Int64Var(&o.toOffset, "to-offset", -1, "move every partition to this offset")
			fs.StringVar(&o.toTime, "to-time", "", "move every partition to the first record at or after this RFC 3339 time")
			fs.BoolVar(&o.toStart, "to-start", false, "move every partition to the start of the log")
			fs.BoolVar(&o.toEnd, "to-end", false, "move every partition to the end of the log")
			fs.BoolVar(&o.dryRun, "dry-run", false, "print the blast radius and change nothing")
			fs.BoolVar(&o.yes, "yes", false, "commit the new offsets (without it, only the blast radius is printed)")
			fs.BoolVar(&o.asJSON, "json", false, "print the plan and the outcome as one JSON object")
			o.timeouts = timeoutFlags(fs)
			o.safetyFlags(fs)
			return func(ctx context.Context) error {
				o.brokers = *brokers
				return replay(ctx, e, o)
			}
		},
	}
}

type replayOpts struct {
	brokers, group, topic string
	toOffset              int64
	toTime                string
	toStart, toEnd        bool
	dryRun, yes, asJSON   bool
	timeouts              *timeouts

	// The safety flags (replaysafety.go).
	force                               bool
	reason, approve                     string
	maxScan                             int
	databaseURL, tablePrefix            *string
	inboxConsumer, idHeader, auditTopic string
}

// replayReport is what --json prints: the plan per partition, its totals,
// and whether the offsets were committed.
type replayReport struct {
	Group       string             `json:"group"`
	Topic       string             `json:"topic"`
	Target      string             `json:"target"`
	Partitions  []replayPartReport `json:"partitions"`
	Again       int64              `json:"records_consumed_again"`
	Skipped     int64              `json:"records_skipped"`
	Changes     int                `json:"partitions_changed"`
	Committed   bool               `json:"committed"`
	Explanation string             `json:"explanation"`
	// HandledAgain says, when records are consumed again, what each scope
	// does with them (replayAgainNote).
	HandledAgain string `json:"handled_again,omitempty"`
	// Policy says what the policy file (--policy) says of the group.
	Policy string `json:"policy,omitempty"`
	// Blast is what the replay gives the consumers again, read from the
	// topic: records, keys, time range, and the DB scope's no-op rate.
	Blast *blastRadius `json:"blast_radius,omitempty"`
	// Forced says that --force overrode the refusal of an at_least_once
	// consumer without a dedupe store.
	Forced bool `json:"forced,omitempty"`
	// Audit is the id of the replay's entry in the audit log.
	Audit string `json:"audit_id,omitempty"`
}

type replayPartReport struct {
	Partition int32 `json:"partition"`
	Committed int64 `json:"committed"` // -1: none
	Target    int64 `json:"target"`
	Clamped   bool  `json:"clamped,omitempty"`
}

func newReplayReport(o *replayOpts, desc string, plan map[int32]*replayPlan) *replayReport {
	r := &replayReport{Group: o.group, Topic: o.topic, Target: desc, Partitions: []replayPartReport{}}
	for _, p := range sortedPartitions(plan) {
		pl := plan[p]
		r.Partitions = append(r.Partitions, replayPartReport{Partition: p, Committed: pl.committed, Target: pl.target, Clamped: pl.clamped})
		switch {
		case pl.committed < 0:
			r.Changes++
		case pl.target < pl.committed:
			r.Again += pl.committed - pl.target
			r.Changes++
		case pl.target > pl.committed:
			r.Skipped += pl.target - pl.committed
			r.Changes++
		}
	}
	return r
}

// replayPlan is one partition's move.
type replayPlan struct {
	committed int64 // -1: none
	target    int64
	epoch     int32
	clamped   bool
}

// replay runs replay: it checks the flags, prints the plan and its blast
// radius, and with --yes audits the replay and commits the group's new
// offsets.
func replay(ctx context.Context, e *env, o *replayOpts) error {
	return runMove(ctx, e, o, offsetMove{
		usage: "give the consumer group with --group and the topic with --topic",
		plan: func(ctx context.Context, kc *kafkaConn, adm *kadm.Client, at time.Time) (map[int32]*replayPlan, error) {
			return planReplay(ctx, kc, adm, o, at)
		},
		again: func(rep *replayReport) { rep.HandledAgain = replayAgainNote(o.group, o.topic) },
		print: func(desc string, plan map[int32]*replayPlan, rep *replayReport) { printReplay(e, o, desc, plan, rep) },
		finish: func(ctx context.Context, kc *kafkaConn, adm *kadm.Client, plan map[int32]*replayPlan, rep *replayReport) error {
			return finishReplay(ctx, e, kc, adm, o, plan, rep)
		},
	})
}

// printReplay writes the plan, the blast radius and what the policy and
// the scopes say of it.
func printReplay(e *env, o *replayOpts, desc string, plan map[int32]*replayPlan, rep *replayReport) {
	fmt.Fprintf(e.stdout, "replay: group %s, topic %s, to %s\n", o.group, o.topic, desc)
	if rep.Policy != "" {
		fmt.Fprintln(e.stdout, rep.Policy)
	}
	printPlan(e.stdout, plan)
	if rep.Blast != nil {
		rep.Blast.print(e.stdout)
	}
	if rep.HandledAgain != "" {
		fmt.Fprintln(e.stdout, rep.HandledAgain)
	}
}

// finishReplay stops at the plan (nothing to do, --dry-run, no --yes), or
// audits the replay and commits the offsets.
func finishReplay(ctx context.Context, e *env, kc *kafkaConn, adm *kadm.Client, o *replayOpts, plan map[int32]*replayPlan, rep *replayReport) error {
	switch {
	case rep.Changes == 0:
		rep.say(e, o, "nothing to do: every partition is already at its target")
		return nil
	case o.dryRun:
		rep.say(e, o, "dry run: nothing changed")
		return nil
	case !o.yes:
		rep.say(e, o, "nothing changed: re-run with --yes to commit these offsets (keep the group's consumers stopped until then)")
		return nil
	}
	// Check right before auditing: a consumer may have started while the
	// plan was read.
	if err := kc.do(ctx, func(ctx context.Context) error { return groupStopped(ctx, adm, o.group) }); err != nil {
		return err
	}
	if err := o.audit(ctx, e, kc, adm, rep); err != nil {
		return err
	}
	moved, err := commitReplay(ctx, kc, adm, o, plan)
	if err != nil {
		return fmt.Errorf("%w (the audit log's entry %s records the attempt)", err, rep.Audit)
	}
	rep.Committed = true
	rep.say(e, o, fmt.Sprintf("committed: group %s will start topic %s at the target offsets on %s when its consumers start; audit log entry %s in %s",
		o.group, o.topic, plural(moved, "partition"), rep.Audit, o.auditTopic))
	return nil
}

// target checks that exactly one of --to-offset, --to-time, --to-start
// and --to-end is given, and returns its description for the plan and,
// for --to-time, the time.
func (o *replayOpts) target() (desc string, at time.Time, err error) {
	targets := 0
	if o.toOffset >= 0 {
		targets++
		desc = fmt.Sprintf("offset %d", o.toOffset)
	} else if o.toOffset < -1 {
		return "", at, usagef("--to-offset must be 0 or more, got %d", o.toOffset)
	}
	if o.toTime != "" {
		targets++
		t, err := time.Parse(time.RFC3339, o.toTime)
		if err != nil {
			return "", at, usagef("--to-time %q is not an RFC 3339 time such as 2024-05-01T00:00:00Z", o.toTime)
		}
		at = t
		desc = "the first record at or after " + t.UTC().Format(time.RFC3339)
	}
	if o.toStart {
		targets++
		desc = "the start of the log"
	}
	if o.toEnd {
		targets++
		desc = "the end of the log"
	}
	if targets != 1 {
		return "", at, usagef("give exactly one target: --to-offset, --to-time, --to-start or --to-end")
	}
	return desc, at, nil
}

// planReplay checks that the topic exists and the group is stopped, and
// returns each partition's move.
func planReplay(ctx context.Context, kc *kafkaConn, adm *kadm.Client, o *replayOpts, at time.Time) (map[int32]*replayPlan, error) {
	if _, err := topicExists(ctx, adm, kc, o.topic, "check --topic"); err != nil {
		return nil, err
	}
	if err := kc.do(ctx, func(ctx context.Context) error { return groupStopped(ctx, adm, o.group) }); err != nil {
		return nil, err
	}
	var plan map[int32]*replayPlan
	err := kc.do(ctx, func(ctx context.Context) (err error) { plan, err = replayTargets(ctx, adm, o, at); return err })
	if err != nil {
		return nil, err
	}
	return plan, nil
}

// say ends the command with msg: as the report's explanation with --json,
// else as a line.
func (r *replayReport) say(e *env, o *replayOpts, msg string) {
	r.Explanation = msg
	if o.asJSON {
		json.NewEncoder(e.stdout).Encode(r) //nolint:errcheck // stdout
		return
	}
	fmt.Fprintln(e.stdout, msg)
}

// commitReplay commits the plan's target offsets for the group, once more
// checked to be stopped, and returns how many partitions it moved.
func commitReplay(ctx context.Context, kc *kafkaConn, adm *kadm.Client, o *replayOpts, plan map[int32]*replayPlan) (int, error) {
	// Check again right before committing: a consumer may have started
	// while the plan was printed.
	if err := kc.do(ctx, func(ctx context.Context) error { return groupStopped(ctx, adm, o.group) }); err != nil {
		return 0, err
	}
	offsets := make(kadm.Offsets)
	for p, pl := range plan {
		if pl.committed == pl.target {
			continue
		}
		offsets.Add(kadm.Offset{Topic: o.topic, Partition: p, At: pl.target, LeaderEpoch: pl.epoch})
	}
	var resp kadm.OffsetResponses
	err := kc.do(ctx, func(ctx context.Context) (err error) {
		resp, err = adm.CommitOffsets(ctx, o.group, offsets)
		return err
	})
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		if errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.IllegalGeneration) || errors.Is(err, kerr.RebalanceInProgress) {
			return 0, fmt.Errorf("committing the offsets of group %q failed: %w: a consumer joined the group meanwhile; stop its consumers first, then re-run", o.group, err)
		}
		return 0, fmt.Errorf("committing the offsets of group %q failed: %w; nothing or part was changed: check with --dry-run and re-run", o.group, err)
	}
	return len(offsets[o.topic]), nil
}

// replayAgainNote says what each scope does with the records a replay of
// group on topic gives its consumers again: the plan counts offsets, and a
// DB-scope runner with StoreOffsets consumes none of those below its stored
// positions.
func replayAgainNote(group, topic string) string {
	return fmt.Sprintf(`"consumed again" counts the records the group's consumers will be given again; what is handled again depends on the group's scope:
  at-least-once: the handler runs again for each of them.
  DB scope: a record whose inbox row is kept is a no-op (its first outcome stands; a dead-lettered one runs again only by 'kscope dlt redrive'); records whose inbox rows InboxTTL deleted are applied again (with Versions: stale when at or below their key's last version).
    With dbscope.Options.StoreOffsets the runner resumes from the positions stored in PostgreSQL where they are ahead of the target and consumes none of them, not even records it never applied (skipped by an earlier replay forward);
    to have them consumed, delete the stored positions while the group is stopped: DELETE FROM kscope_offsets WHERE consumer = '%s' AND topic = '%s' (the Options.TablePrefix and Options.Consumer of the pipeline, if set).
  Kafka scope: the outputs are produced again (read_committed readers see them again), except for records at or below their key's last version (Options.Versions): stale, no outputs.`,
		strings.ReplaceAll(group, "'", "''"), strings.ReplaceAll(topic, "'", "''"))
}

// groupStopped returns an error unless group exists and has no members.
func groupStopped(ctx context.Context, adm *kadm.Client, group string) error {
	state, members, err := describeGroup(ctx, adm, group)
	if err != nil {
		return err
	}
	if state == "" {
		return fmt.Errorf("consumer group %q does not exist (no member ever joined it and it has no committed offsets): check --group; 'kafka-consumer-groups --list' lists the groups", group)
	}
	if len(members) > 0 || (state != "Empty" && state != "Dead") {
		return fmt.Errorf("consumer group %q is still active (state %s, %d members: %s): stop its consumers first, then re-run", group, state, len(members), strings.Join(members, ", "))
	}
	return nil
}

// describeGroup returns group's state and members, looked up as a classic
// group and then as a KIP-848 consumer group. The state is "" when the group
// does not exist.
func describeGroup(ctx context.Context, adm *kadm.Client, group string) (string, []string, error) {
	gs, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return "", nil, fmt.Errorf("describing consumer group %q: %w", group, err)
	}
	g, ok := gs[group]
	if ok && g.Err == nil && g.State != "Dead" {
		var ms []string
		for _, m := range g.Members {
			ms = append(ms, m.ClientID+"@"+strings.TrimPrefix(m.ClientHost, "/"))
		}
		return g.State, ms, nil
	}
	if ok && g.Err != nil && !errors.Is(g.Err, kerr.GroupIDNotFound) {
		return "", nil, fmt.Errorf("describing consumer group %q: %w", group, g.Err)
	}
	// Not a classic group: a KIP-848 consumer group, or none. Brokers
	// without KIP-848 answer with an error, read as "none".
	cgs, err := adm.DescribeConsumerGroups(ctx, group)
	if err != nil {
		return "", nil, nil
	}
	cg, ok := cgs[group]
	if !ok || cg.Err != nil || cg.State == "Dead" || cg.State == "" {
		return "", nil, nil
	}
	var ms []string
	for _, m := range cg.Members {
		ms = append(ms, m.ClientID+"@"+strings.TrimPrefix(m.ClientHost, "/"))
	}
	return cg.State, ms, nil
}

// replayTargets returns the move of each partition of the topic, from
// the group's committed offsets.
func replayTargets(ctx context.Context, adm *kadm.Client, o *replayOpts, at time.Time) (map[int32]*replayPlan, error) {
	return logTargets(ctx, adm, o, at, func(ctx context.Context) (map[int32]int64, error) {
		committed, err := adm.FetchOffsetsForTopics(ctx, o.group, o.topic)
		if err == nil {
			err = committed.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("fetching the committed offsets of group %q: %w", o.group, err)
		}
		at := map[int32]int64{}
		for p, c := range committed[o.topic] {
			if c.At >= 0 {
				at[p] = c.At
			}
		}
		return at, nil
	})
}

// printPlan writes the blast radius and returns how many partitions move.
func printPlan(w io.Writer, plan map[int32]*replayPlan) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tCOMMITTED\tTARGET\tEFFECT")
	var again, skipped int64
	changes, uncommitted := 0, 0
	for _, p := range sortedPartitions(plan) {
		pl := plan[p]
		target := fmt.Sprint(pl.target)
		if pl.clamped {
			target += " (clamped)"
		}
		var committed, effect string
		switch {
		case pl.committed < 0:
			committed, effect = "none", "no committed offset yet: will start at the target"
			changes++
			uncommitted++
		case pl.target < pl.committed:
			n := pl.committed - pl.target
			committed, effect = fmt.Sprint(pl.committed), plural64(n, "record")+" consumed again"
			again += n
			changes++
		case pl.target > pl.committed:
			n := pl.target - pl.committed
			committed, effect = fmt.Sprint(pl.committed), plural64(n, "record")+" skipped"
			skipped += n
			changes++
		default:
			committed, effect = fmt.Sprint(pl.committed), "unchanged"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", p, committed, target, effect)
	}
	tw.Flush()
	fmt.Fprintf(w, "total: %s consumed again, %s skipped", plural64(again, "record"), plural64(skipped, "record"))
	if uncommitted > 0 {
		fmt.Fprintf(w, ", %s without a committed offset", plural(uncommitted, "partition"))
	}
	fmt.Fprintln(w)
}

func plural64(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
