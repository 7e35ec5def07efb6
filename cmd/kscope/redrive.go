package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os/user"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Progress lines of a redrive are written every progressEvery records or
// progressInterval, whichever comes first.
const (
	progressEvery    = 1000
	progressInterval = 5 * time.Second
	// produceTimeout bounds the delivery of one redriven record.
	produceTimeout = 30 * time.Second
)

// routingHeaders are the per-attempt headers a redrive drops, so that the
// redriven record starts with a fresh retry budget. The identity
// (consumer.HeaderID), the original coordinates (consumer.HeaderOriginal*),
// the group and the original key are kept: a redriven record that was
// already applied dedupes as a no-op downstream.
var routingHeaders = map[string]bool{
	retrytopic.HeaderAttempt:      true,
	retrytopic.HeaderDue:          true,
	retrytopic.HeaderStage:        true,
	retrytopic.HeaderParked:       true,
	retrytopic.HeaderError:        true,
	retrytopic.HeaderErrorClass:   true,
	retrytopic.HeaderFirstFailure: true,
	retrytopic.HeaderLastFailure:  true,
	// The audit note of an earlier redrive is replaced by this one's.
	retrytopic.HeaderRedrive: true,
}

// springPrefix starts Spring Kafka's dead-letter headers, dropped too.
const springPrefix = "kafka_dlt-"

// dltRedriveUsage is dlt redrive's synopsis, description and examples.
const dltRedriveUsage = `
Usage:
  kscope dlt redrive (--topic T | --group G) --to source|retry [filters] [--dry-run]

Re-publishes the records of a dead-letter topic that match the filters
(the same as 'kscope dlt list', plus --id) to:

  --to source   each record's original topic (its kscope-original-topic header)
  --to retry    the group's first retry topic, <group>.kscope-retry-<delay>
                with <delay> = --ladder-first; needs --group

The source topic is read by every consumer group on it, not only the one
whose dead letters these are: a group in the DB scope that applied the
record (within its inbox TTL) dedupes it by its identity, but a group in
another scope (at-least-once, Kafka) handles it again. --to retry reaches
the group alone.

Each record keeps its key, value and headers, including its kscope identity
(kscope-id) and original coordinates, so a record that was already applied
is deduplicated downstream as a no-op. An identity that the topic holds
twice (dead-lettered again by a consumer killed between the DLT's
acknowledgement and the transaction that records it) is sent once, its
first copy; the summary counts the later copies. The per-attempt routing headers
(attempt, due, stage, parked, error, error class, failure times, Spring's
kafka_dlt-*) are dropped, so the record gets a fresh retry budget, and a
kscope-redrive audit header is added: "by=<who> at=<RFC 3339 UTC> from=<dlt
topic>/<partition>/<offset>".

A redriven record dead-lettered for a version gap (it carries
kscope-version-expected, class terminal) is checked again against its key's
last version: applied when the missing versions were applied meanwhile,
stale (not handled, and in the DB scope recorded as applied) when its key
moved past it, and otherwise waiting again in the retry topics for a whole
GapTimeout (its first-failure time is dropped with the other routing
headers), then dead-lettered again. Redrive it once the versions before it
are in, or run the pipeline with sequence.Accept to apply it over the gap.

Redrive does NOT remove the records from the dead-letter topic: Kafka cannot
delete single records. They stay there until retention drops them; use
--from-offset to skip what an earlier redrive already sent.

With --group (and not --dry-run), the redrive commits, per partition, the
offset past the records it handled in offset order from the group
<group>.kscope-triage's committed offset, under that group: the dead
letters before it no longer count as waiting (dlt list's count and the
gauge kscope_dead_letters_waiting). The first record a filter passes
over, or one skipped, ends that run: it and the later records wait on.

Partitions are redriven one after the other, each in offset order; records
are produced one at a time, synchronously, at most --rate per second. The
first produce error stops the redrive and says where to resume. So do
records that retention deletes before the redrive reaches them: it names
them instead of passing over them. Records that a transaction still open
holds back (read-committed) are not read: the redrive names them and
exits 1, to be resumed from there once the transaction ends. Nothing
stops two redrives of one topic (a rerun after a crash, two operators at
once) from sending a record twice: it keeps its identity, so a consumer
that deduplicates (DB scope) applies it once; resume a redrive cut short
from the partition and offset of its last progress line instead of
running it again. Progress goes to stderr, the summary to stdout.

With --json the summary is one JSON object: "sent" counts the records
produced; a --dry-run sends none ("sent":0) and counts what it would send
in "would_send", which only a dry run reports. "per_topic" counts them per
target topic.

Examples:
  kscope dlt redrive --group payments --to source --dry-run
  kscope dlt redrive --group payments --to source --class retryable --rate 50
  kscope dlt redrive --group payments --to retry --partition 0 --from-offset 1200
  kscope dlt redrive --group payments --to source --id order-42 --by alice
`

func dltRedriveCmd() *command {
	return &command{
		name:    "dlt redrive",
		summary: "re-publish dead-letter records to their source topic or the first retry topic",
		usage:   dltRedriveUsage,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			f := declareDLTFlags(fs, true)
			o := &redriveOpts{}
			fs.StringVar(&o.to, "to", "", "where to send the records: source or retry (required)")
			fs.DurationVar(&o.ladderFirst, "ladder-first", retrytopic.DefaultLadder[0], "with --to retry: the delay of the group's first retry topic")
			fs.StringVar(&o.by, "by", "", "who redrives, for the audit header (default $USER)")
			fs.BoolVar(&o.dryRun, "dry-run", false, "print what would be sent and send nothing")
			fs.Float64Var(&o.rate, "rate", 100, "at most this many records per second (0: no limit)")
			fs.BoolVar(&o.asJSON, "json", false, "print the summary (and, with --dry-run, each record) as JSON objects, one per line")
			ed := declareEditFlags(fs)
			return func(ctx context.Context) error {
				if ed.file != "" {
					return editRedrive(ctx, e, f, o, ed)
				}
				o.auditTopic = ed.tf.auditTopic
				return dltRedrive(ctx, e, f, o)
			}
		},
	}
}

type redriveOpts struct {
	to          string
	auditTopic  string // where kscope dlt skip recorded the resolved dead letters
	ladderFirst time.Duration
	by          string
	dryRun      bool
	rate        float64
	asJSON      bool
}

// redriveReport is the summary --json prints.
type redriveReport struct {
	DLTTopic string `json:"dlt_topic"`
	To       string `json:"to"`
	DryRun   bool   `json:"dry_run"`
	Scanned  int    `json:"scanned"`
	Matched  int    `json:"matched"`
	// Sent is the number of records produced: 0 with --dry-run, which
	// counts in WouldSend what it would have sent instead.
	Sent      int  `json:"sent"`
	WouldSend *int `json:"would_send,omitempty"` // --dry-run only
	Skipped   int  `json:"skipped"`
	Copies    int  `json:"copies"`   // later copies of an identity already sent
	Resolved  int  `json:"resolved"` // dead letters kscope dlt skip resolved, not sent
	// PerTopic counts the records sent (with --dry-run: that would be
	// sent) per target topic.
	PerTopic map[string]int `json:"per_topic"`
	Error    string         `json:"error,omitempty"`
}

// redriveLine is one record a --dry-run --json would send.
type redriveLine struct {
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Key       string `json:"key"`
	ID        string `json:"id"`
	Target    string `json:"target"`
}

// redriveStats counts a redrive.
type redriveStats struct {
	matched, sent, skipped int
	copies                 int   // later copies of an identity already sent
	resolved               int   // dead letters kscope dlt skip resolved, not sent
	scanned, total         int64 // records read, and in the range to read
	perTopic               map[string]int
	started, lastProgress  time.Time
}

// progress is the progress line: what was sent, how far the scan is, and
// when it should end at the pace so far.
func (st *redriveStats) progress(verb string, r *kgo.Record, now time.Time) string {
	elapsed := now.Sub(st.started)
	line := fmt.Sprintf("redrive: %s %s, skipped %d; scanned %d of %d records", verb, plural(st.sent, "record"), st.skipped, st.scanned, st.total)
	if st.total > 0 {
		line += fmt.Sprintf(" (%.0f%%)", 100*float64(st.scanned)/float64(st.total))
	}
	line += fmt.Sprintf(", at partition %d offset %d, %.1f/s", r.Partition, r.Offset, float64(st.sent)/max(elapsed.Seconds(), 1e-3))
	if st.scanned > 0 && st.total > st.scanned {
		eta := time.Duration(float64(elapsed) / float64(st.scanned) * float64(st.total-st.scanned))
		line += ", ETA " + eta.Round(time.Second).String()
	}
	return line
}

// retryTopic checks --to, --ladder-first and --rate, and returns the
// group's first retry topic with --to retry ("" with --to source).
func (o *redriveOpts) retryTopic(group string) (string, error) {
	var retryTopic string
	switch o.to {
	case "source":
	case "retry":
		if group == "" {
			return "", usagef("--to retry needs --group: the retry topics are per consumer group")
		}
		if o.ladderFirst <= 0 {
			return "", usagef("--ladder-first must be a positive duration such as 5s, got %v", o.ladderFirst)
		}
		retryTopic = retrytopic.RetryTopic(group, o.ladderFirst)
	case "":
		return "", usagef("say where to send the records: --to source (their original topic) or --to retry (the group's first retry topic)")
	default:
		return "", usagef("unknown --to %q: use source or retry", o.to)
	}
	if o.rate < 0 {
		return "", usagef("--rate must be 0 (no limit) or more, got %v", o.rate)
	}
	return retryTopic, nil
}

// auditor returns who redrives, for the audit header: --by, else $USER,
// else the current user's name.
func (o *redriveOpts) auditor(e *env) (string, error) {
	by := o.by
	if by == "" {
		by = e.getenv("USER")
	}
	if by == "" {
		if u, err := user.Current(); err == nil {
			by = u.Username
		}
	}
	if by == "" {
		return "", usagef("cannot tell who you are for the audit header: set --by")
	}
	return by, nil
}

// redriver is one run of dlt redrive: the dead-letter topic it reads,
// where it sends each record, the clients it reads and sends with, and
// what it has sent so far.
type redriver struct {
	e          *env
	o          *redriveOpts
	kc         *kafkaConn
	adm        *kadm.Client
	cl         *kgo.Client
	topic      string // the dead-letter topic
	retryTopic string // with --to retry, the target of every record
	by         string // who redrives, for the audit header
	flt        *recordFilter
	tick       <-chan time.Time // paces the sends at --rate; nil: no limit
	checked    map[string]error // target topics checked to exist
	// sentIDs are the identities sent: a record dead-lettered twice (a
	// consumer killed between the DLT's acknowledgement and the
	// transaction that records it) is sent once, its first copy.
	sentIDs map[string]bool
	st      *redriveStats
	tr      *triage // what the redrive handled, committed under the triage group
	// resolved are the identities kscope dlt skip resolved, with their
	// audit records: not sent.
	resolved map[string]string
}

// dltRedrive runs dlt redrive: it checks the flags, then reads the
// dead-letter topic and sends each selected record to its target.
func dltRedrive(ctx context.Context, e *env, f *dltFlags, o *redriveOpts) error {
	topic, err := f.dltTopic()
	if err != nil {
		return err
	}
	rng, flt, err := f.selection()
	if err != nil {
		return err
	}
	retryTopic, err := o.retryTopic(*f.group)
	if err != nil {
		return err
	}
	by, err := o.auditor(e)
	if err != nil {
		return err
	}
	kc, err := e.kafka(*f.brokers, f.timeouts)
	if err != nil {
		return err
	}
	cl, err := kc.client(
		kgo.RecordPartitioner(redrivePartitioner()),
		kgo.RecordDeliveryTimeout(produceTimeout),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	rd := &redriver{e: e, o: o, kc: kc, adm: adm, cl: cl, topic: topic, retryTopic: retryTopic, by: by, flt: flt}
	if o.rate > 0 && !o.dryRun {
		t := time.NewTicker(time.Duration(float64(time.Second) / o.rate))
		defer t.Stop()
		rd.tick = t.C
	}
	rd.checked = make(map[string]error)
	rd.sentIDs = make(map[string]bool)
	rd.st = &redriveStats{perTopic: make(map[string]int), started: time.Now()}
	if rd.tr, err = rd.triage(ctx, *f.group, rng); err != nil {
		return err
	}
	if err := rd.loadResolved(ctx, *f.group); err != nil {
		return err
	}
	if err := rd.measure(ctx, rng); err != nil {
		return err
	}
	held, err := scan(ctx, kc, adm, topic, rng, func(r *kgo.Record) error { return rd.record(ctx, r) })
	err = rd.resumable(err, held)
	if cerr := rd.commitTriage(ctx, err == nil); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return rd.finish(err)
}

// measure counts the records in the range to read, for the progress
// lines' percentage and ETA; brokers that do not answer fail the redrive,
// which would wait as long again in the scan, and any other error leaves
// the count at 0.
func (rd *redriver) measure(ctx context.Context, rng scanRange) error {
	st := rd.st
	if bs, err := bounds(ctx, rd.adm, rd.kc, rd.topic, rng); err == nil {
		rd.tr.bounds = bs
		for _, b := range bs {
			st.total += max(b.end-b.begin, 0)
		}
	} else if isTimeout(err) {
		return err // the brokers do not answer: the scan would wait as long again
	}
	st.lastProgress = st.started
	return nil
}

// verb says what the redrive does with a record: "sent", or "would send"
// in a dry run.
func (rd *redriver) verb() string {
	if rd.o.dryRun {
		return "would send"
	}
	return "sent"
}

// record redrives one record the scan read: one the filters do not select
// is passed over, a later copy of an identity already sent is counted,
// and any other is sent to its target.
func (rd *redriver) record(ctx context.Context, r *kgo.Record) error {
	st := rd.st
	st.scanned++
	m, derr := decode(r)
	if !rd.flt.match(r, m) {
		rd.tr.saw(r, false)
		return nil
	}
	st.matched++
	if rd.passResolved(r, m) {
		rd.tr.saw(r, true)
		return nil
	}
	if rd.sentIDs[m.ID] {
		st.copies++
		rd.tr.saw(r, true)
		return nil
	}
	target, ok := rd.target(r, m, derr)
	if !ok {
		rd.tr.saw(r, false)
		return nil
	}
	if err := rd.checkTarget(ctx, r, target); err != nil {
		return err
	}
	if err := rd.send(ctx, r, m, target); err != nil {
		return err
	}
	rd.sent(r, m, target)
	rd.tr.saw(r, true)
	return nil
}

// target returns the topic r goes to: the group's first retry topic, or
// with --to source its original topic. A record whose original topic is
// unknown is skipped, said on stderr (ok is false).
func (rd *redriver) target(r *kgo.Record, m retrytopic.Metadata, derr error) (target string, ok bool) {
	if rd.o.to != "source" {
		return rd.retryTopic, true
	}
	// Without a valid header, FromRecord falls back to the
	// record's own topic: the dead-letter topic.
	if _, ok := (&consumer.Record{Record: r}).Header(consumer.HeaderOriginalTopic); !ok || m.OriginalTopic == rd.topic {
		rd.st.skipped++
		fmt.Fprintf(rd.e.stderr, "skipped partition %d offset %d: it has no valid %s header naming another topic, so its source topic is unknown (redrive it with --to retry, or produce it by hand)\n",
			r.Partition, r.Offset, consumer.HeaderOriginalTopic)
		warnDecode(rd.e.stderr, r, derr)
		return "", false
	}
	return m.OriginalTopic, true
}

// checkTarget fails when r would go back to the dead-letter topic itself,
// or to a topic that does not exist; each target is looked up once.
func (rd *redriver) checkTarget(ctx context.Context, r *kgo.Record, target string) error {
	if target == rd.topic {
		return fmt.Errorf("partition %d offset %d would be sent back to the dead-letter topic %s itself: check its %s header", r.Partition, r.Offset, rd.topic, consumer.HeaderOriginalTopic)
	}
	if err, ok := rd.checked[target]; ok {
		return err
	}
	what := "create it, or redrive with --to retry"
	if rd.o.to == "retry" {
		what = "the retry topics are created when the group's consumers start with retries enabled; check --group and --ladder-first"
	}
	_, err := topicExists(ctx, rd.adm, rd.kc, target, what)
	rd.checked[target] = err
	if err != nil {
		return fmt.Errorf("cannot redrive partition %d offset %d: %w", r.Partition, r.Offset, err)
	}
	return nil
}

// send produces the redriven copy of r to target, at most --rate per
// second; a dry run prints what it would send instead.
func (rd *redriver) send(ctx context.Context, r *kgo.Record, m retrytopic.Metadata, target string) error {
	e, o := rd.e, rd.o
	out := redriveRecord(r, target, m, rd.by, time.Now())
	switch {
	case o.dryRun && o.asJSON:
		json.NewEncoder(e.stdout).Encode(redriveLine{Partition: r.Partition, Offset: r.Offset, Key: keyText(r.Key), ID: m.ID, Target: target}) //nolint:errcheck // stdout
	case o.dryRun:
		fmt.Fprintf(e.stdout, "would send partition %d offset %d (key %s, id %s) to %s\n", r.Partition, r.Offset, cell(keyText(r.Key), listKeyWidth), m.ID, target)
	default:
		if rd.tick != nil {
			select {
			case <-rd.tick:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := rd.cl.ProduceSync(ctx, out).FirstErr(); err != nil {
			return fmt.Errorf("producing partition %d offset %d to %s failed after %s sent: %w; "+
				"fix the cause (topic ACLs, broker availability, record size), then resume from this record with --partition %d --from-offset %d "+
				"and redrive the later partitions (partitions are redriven in order); records sent twice keep their identity, so a deduplicating consumer applies them once",
				r.Partition, r.Offset, target, plural(rd.st.sent, "record"), err, r.Partition, r.Offset)
		}
	}
	return nil
}

// sent counts r as sent to target, and writes a progress line every
// progressEvery records or progressInterval.
func (rd *redriver) sent(r *kgo.Record, m retrytopic.Metadata, target string) {
	st := rd.st
	st.sent++
	rd.sentIDs[m.ID] = true
	st.perTopic[target]++
	if now := time.Now(); st.sent%progressEvery == 0 || now.Sub(st.lastProgress) >= progressInterval {
		st.lastProgress = now
		fmt.Fprintln(rd.e.stderr, st.progress(rd.verb(), r, now))
	}
}

// resumable returns the error the scan ended with, or the records it could
// not read, saying where to resume the redrive.
func (rd *redriver) resumable(err error, held []heldBack) error {
	var de *deletedError
	if errors.As(err, &de) {
		err = fmt.Errorf("%w; they were not redriven (%s sent); resume with --partition %d --from-offset %d and redrive the later partitions (partitions are redriven in order)",
			de, plural(rd.st.sent, "record"), de.partition, de.start)
	}
	if err == nil && len(held) > 0 {
		notes := make([]string, len(held))
		for i, h := range held {
			notes[i] = fmt.Sprintf("%s; redrive them once it ends with --partition %d --from-offset %d", h, h.partition, h.from)
		}
		err = fmt.Errorf("not every record was read: %s", strings.Join(notes, "; "))
	}
	return err
}

// finish prints the summary (with --json, the report) and returns err, or
// an error when records were skipped.
func (rd *redriver) finish(err error) error {
	e, o, st := rd.e, rd.o, rd.st
	summary := redriveSummary(rd.topic, rd.verb(), st)
	if o.asJSON {
		rd.printReport(err)
		summary = ""
	}
	if err != nil {
		if summary != "" {
			fmt.Fprintln(e.stdout, summary)
		}
		return err
	}
	if summary != "" {
		if o.dryRun {
			summary += "; dry run: nothing was sent"
		} else if st.sent > 0 {
			summary += "; the records stay in the dead-letter topic (Kafka cannot delete single records)"
		}
		fmt.Fprintln(e.stdout, summary)
	}
	if st.skipped > 0 {
		return fmt.Errorf("skipped %s: their source topic is unknown (see the lines above); redrive them with --to retry", plural(st.skipped, "record"))
	}
	return nil
}

// printReport writes the --json summary, with the error the redrive ends
// with, if any.
func (rd *redriver) printReport(err error) {
	o, st := rd.o, rd.st
	rep := redriveReport{DLTTopic: rd.topic, To: o.to, DryRun: o.dryRun, Scanned: int(st.scanned), Matched: st.matched,
		Sent: st.sent, Skipped: st.skipped, Copies: st.copies, Resolved: st.resolved, PerTopic: st.perTopic}
	if o.dryRun {
		rep.Sent, rep.WouldSend = 0, &st.sent
	}
	if err != nil {
		rep.Error = err.Error()
	}
	json.NewEncoder(rd.e.stdout).Encode(rep) //nolint:errcheck // stdout
}
