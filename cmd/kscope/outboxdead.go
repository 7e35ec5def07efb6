package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kscope-dev/kscope/outbox"
)

func outboxDeadListCmd() *command {
	return &command{
		name:    "outbox dead list",
		summary: "list the rows an outbox relay moved to the dead-letter table",
		usage: `
Usage:
  kscope outbox dead list [--outbox NAME] [--database-url URL] [--table-prefix P] [--json]

Lists the rows of the outbox dead-letter table (<prefix>outbox_dead): rows
Kafka refuses for good (larger than the relay's kgo.ProducerBatchMaxBytes or
the topic's max.message.bytes, a record the broker rejects, a topic name
Kafka does not allow), which the relay moved there so that the rows after
them are published. Each is listed with its identity
(<outbox>/<partition>/<seq>, the kscope-id header its record carries),
topic, key, size (key, value and headers), when the relay moved it there
and what Kafka answered, in the order the relay met them. It changes
nothing. Such a row is not published until it is requeued: see
'kscope outbox dead requeue -h'.

Examples:
  kscope outbox dead list
  kscope outbox dead list --outbox payments --json | jq .error
`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			f := declareDeadFlags(fs)
			asJSON := fs.Bool("json", false, "print one JSON object per row and line")
			return func(ctx context.Context) error { return deadList(ctx, e, f, *asJSON) }
		},
	}
}

// deadFlags are the flags every outbox dead command takes.
type deadFlags struct {
	dbURL, prefix, outbox *string
	timeouts              *timeouts
}

func declareDeadFlags(fs *flag.FlagSet) *deadFlags {
	return &deadFlags{
		dbURL:    databaseFlag(fs),
		prefix:   tablePrefixFlag(fs),
		outbox:   fs.String("outbox", "", "only the rows of this outbox (default: every outbox)"),
		timeouts: timeoutFlags(fs),
	}
}

// open returns the dead-letter table of the flags.
func (f *deadFlags) open(e *env) (*deadTable, error) {
	db, err := e.database(*f.dbURL, f.timeouts)
	if err != nil {
		return nil, err
	}
	return &deadTable{db: db, dl: outbox.DeadLetters{DB: db.Pool, TablePrefix: *f.prefix}}, nil
}

// deadTable is an outbox dead-letter table whose every call is one
// request to the database, bounded by --request-timeout.
type deadTable struct {
	db *dbConn
	dl outbox.DeadLetters
}

func (d *deadTable) Close() { d.db.Close() }

func (d *deadTable) List(ctx context.Context, name string) (rows []outbox.DeadRow, err error) {
	err = d.db.request(ctx, func(ctx context.Context) error { rows, err = d.dl.List(ctx, name); return err })
	return rows, err
}

func (d *deadTable) Get(ctx context.Context, id string) (row outbox.DeadRow, err error) {
	err = d.db.request(ctx, func(ctx context.Context) error { row, err = d.dl.Get(ctx, id); return err })
	return row, err
}

func (d *deadTable) Requeue(ctx context.Context, id, topic string) (q outbox.Requeued, err error) {
	err = d.db.request(ctx, func(ctx context.Context) error { q, err = d.dl.Requeue(ctx, id, topic); return err })
	return q, err
}

func (d *deadTable) Discard(ctx context.Context, id string) error {
	return d.db.request(ctx, func(ctx context.Context) error { return d.dl.Discard(ctx, id) })
}

// deadEntry is one row in outbox dead list --json.
type deadEntry struct {
	ID        string  `json:"id"`
	Outbox    string  `json:"outbox"`
	Partition int     `json:"partition"`
	Seq       int64   `json:"seq"`
	Topic     string  `json:"topic"`
	Key       *string `json:"key"`
	KeyHex    string  `json:"key_hex,omitempty"`
	Bytes     int     `json:"bytes"`
	CreatedAt string  `json:"created_at"`
	DeadAt    string  `json:"dead_at"`
	Error     string  `json:"error"`
}

func toDeadEntry(w outbox.DeadRow) deadEntry {
	k, kh := keyJSON(w.Key)
	return deadEntry{ID: w.ID, Outbox: w.Outbox, Partition: w.Partition, Seq: w.Seq, Topic: w.Topic, Key: k, KeyHex: kh,
		Bytes: w.Size, CreatedAt: timeText(w.Created), DeadAt: timeText(w.Dead), Error: w.Error}
}

func deadList(ctx context.Context, e *env, f *deadFlags, asJSON bool) error {
	dl, err := f.open(e)
	if err != nil {
		return err
	}
	defer dl.Close()
	rows, err := dl.List(ctx, *f.outbox)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		for _, w := range rows {
			if err := enc.Encode(toDeadEntry(w)); err != nil {
				return err
			}
		}
		return nil
	}
	if len(rows) > 0 {
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTOPIC\tKEY\tBYTES\tDEAD SINCE\tERROR")
		for _, w := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", escape(w.ID), escape(w.Topic), cell(keyText(w.Key), listKeyWidth), w.Size, timeText(w.Dead), cell(w.Error, listErrorWidth))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	where := "every outbox"
	if *f.outbox != "" {
		where = "outbox " + *f.outbox
	}
	fmt.Fprintf(e.stdout, "%s in the dead-letter table of %s\n", plural(len(rows), "dead row"), where)
	if len(rows) > 0 {
		fmt.Fprintln(e.stdout, "See one with 'kscope outbox dead show ID'; once Kafka takes it, publish it with 'kscope outbox dead requeue ID', or drop it with 'kscope outbox dead discard ID'.")
	}
	return nil
}

func outboxDeadShowCmd() *command {
	return &command{
		name:      "outbox dead show",
		summary:   "print one dead outbox row in full: key, headers, value, Kafka's answer",
		takesArgs: true,
		usage: `
Usage:
  kscope outbox dead show ID [--database-url URL] [--table-prefix P] [--max-value N] [--json]

Prints the dead-letter row of identity ID (as 'kscope outbox dead list'
shows it): where it was in its outbox, its topic, key, every header (as the
relay would publish them, plus the kscope-id header it adds), its value (as
text when it is printable UTF-8, else as a hex dump; cut to --max-value
bytes), when it was written and dead-lettered, and what Kafka answered. It
changes nothing.

Examples:
  kscope outbox dead show default/3/1042
  kscope outbox dead show default/3/1042 --max-value 0 --json
`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			f := declareDeadFlags(fs)
			maxValue := fs.Int("max-value", 4096, "print at most this many bytes of the value (0: all)")
			asJSON := fs.Bool("json", false, "print the row as one JSON object")
			return func(ctx context.Context) error { return deadShow(ctx, e, f, *maxValue, *asJSON) }
		},
	}
}

// deadShowEntry is outbox dead show --json.
type deadShowEntry struct {
	deadEntry
	Headers        []headerJSON `json:"headers"`
	HeadersError   string       `json:"headers_error,omitempty"`
	Value          *string      `json:"value"`
	ValueHex       string       `json:"value_hex,omitempty"`
	ValueSize      int          `json:"value_size"`
	ValueTruncated bool         `json:"value_truncated,omitempty"`
}

func deadShow(ctx context.Context, e *env, f *deadFlags, maxValue int, asJSON bool) error {
	if len(e.args) != 1 {
		return usagef("give one row's identity, such as default/3/1042 (see them with 'kscope outbox dead list')")
	}
	if maxValue < 0 {
		return usagef("--max-value must be 0 (no limit) or more, got %d", maxValue)
	}
	id := e.args[0]
	dl, err := f.open(e)
	if err != nil {
		return err
	}
	defer dl.Close()
	w, err := dl.Get(ctx, id)
	if errors.Is(err, outbox.ErrNotDead) {
		return fmt.Errorf("%s is not in the dead-letter table: requeued or discarded already, or never dead-lettered (see 'kscope outbox dead list')", id)
	}
	if err != nil {
		return err
	}
	if *f.outbox != "" && w.Outbox != *f.outbox {
		return fmt.Errorf("%s is a row of outbox %s, not of --outbox %s", id, w.Outbox, *f.outbox)
	}
	if asJSON {
		return json.NewEncoder(e.stdout).Encode(deadShowJSON(w, maxValue))
	}
	deadShowText(e.stdout, w, maxValue)
	return nil
}

func deadShowJSON(w outbox.DeadRow, maxValue int) deadShowEntry {
	s := deadShowEntry{deadEntry: toDeadEntry(w), Headers: headersJSON(w.Headers), ValueSize: len(w.Value)}
	if w.HeadersErr != nil {
		s.HeadersError = w.HeadersErr.Error()
	}
	s.Value, s.ValueHex, s.ValueTruncated = valueJSON(w.Value, maxValue)
	return s
}

func deadShowText(out io.Writer, w outbox.DeadRow, maxValue int) {
	fmt.Fprintf(out, "id:         %s\n", escape(w.ID))
	fmt.Fprintf(out, "place:      outbox %s, partition %d, sequence number %d\n", escape(w.Outbox), w.Partition, w.Seq)
	fmt.Fprintf(out, "topic:      %s\n", escape(w.Topic))
	fmt.Fprintf(out, "key:        %s\n", keyText(w.Key))
	fmt.Fprintf(out, "size:       %d bytes of key, value and headers\n", w.Size)
	fmt.Fprintf(out, "written:    %s\n", timeText(w.Created))
	fmt.Fprintf(out, "dead since: %s\n", timeText(w.Dead))
	fmt.Fprintf(out, "error:      %s\n", escape(w.Error))
	fmt.Fprintf(out, "headers:    %d, and kscope-id: %s when published\n", len(w.Headers), escape(w.ID))
	headersText(out, w.Headers)
	if w.HeadersErr != nil {
		fmt.Fprintf(out, "  (the stored headers cannot be decoded: %v; the relay publishes the row without them)\n", w.HeadersErr)
	}
	valueText(out, w.Value, maxValue)
}

func outboxDeadRequeueCmd() *command {
	return &command{
		name:      "outbox dead requeue",
		summary:   "move dead outbox rows back into their outbox, to be published with their identity",
		takesArgs: true,
		usage: `
Usage:
  kscope outbox dead requeue (ID... | --all [--outbox NAME]) [--topic T] [--dry-run] [--yes] [--json]

Moves the dead-letter rows of the identities given (or --all of them, of
--outbox or of every outbox) back into their outbox, where the relay
publishes them: in one PostgreSQL transaction per row, the row is deleted
from the dead-letter table and added at the end of its outbox partition,
numbered through the partition's sequence row as outbox.Add numbers rows,
so a crash leaves it in exactly one of the two tables and the partition
stays gapless.

The record keeps its identity: it is published with the kscope-id header
it was written with (its ID), not that of its new place, so a consumer that
saw it already (a relay fenced between publishing a row and dead-lettering
it can have done both) drops the copy. It is published AFTER the records of
its key added since it was written: per-key order is not restored. Rows are
requeued in the order 'kscope outbox dead list' shows them, whatever the
order of the IDs, so the rows of one key keep their own order.

Before requeuing, check:
  - that Kafka takes the row now: the topic's max.message.bytes (or the
    brokers' message.max.bytes) and the relays' kgo.ProducerBatchMaxBytes
    raised above its size (BYTES in the list) plus about a hundred bytes,
    and the relays restarted with it. A row Kafka still refuses is
    dead-lettered again, with the same ID. A row to a topic name Kafka does
    not allow is skipped unless --topic gives the one it was meant for;
  - that its consumers can take it after newer records of its key: one
    that checks per-key versions (kscope's sequence package) skips it as
    stale, and one that keeps the last state of a key would go back to an
    older one. Discard it instead ('kscope outbox dead discard'), and write
    what it should say anew, when that is so;
  - that the relays run this version of kscope or a later one: an older
    relay publishes a requeued row under the identity of its new place.

It first prints the rows it would requeue. With --dry-run, or without
--yes, it stops there and changes nothing. An ID that is not in the
dead-letter table (requeued or discarded already, or mistyped) is named and
makes it exit 1, after the others are requeued.

Examples:
  kscope outbox dead requeue default/3/1042
  kscope outbox dead requeue default/3/1042 default/3/1077 --yes
  kscope outbox dead requeue --all --outbox payments --dry-run
  kscope outbox dead requeue default/0/12 --topic payments.booked --yes
`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			o := &deadOpts{verb: "requeue", done: "requeued", f: declareDeadFlags(fs)}
			fs.BoolVar(&o.all, "all", false, "every row of the dead-letter table (of --outbox, when given)")
			fs.StringVar(&o.topic, "topic", "", "publish the rows to this topic instead of theirs (for a topic name Kafka does not allow)")
			fs.BoolVar(&o.dryRun, "dry-run", false, "print the rows it would requeue and change nothing")
			fs.BoolVar(&o.yes, "yes", false, "requeue them (without it, only the rows are printed)")
			fs.BoolVar(&o.asJSON, "json", false, "print the rows and the outcome as one JSON object")
			return func(ctx context.Context) error { return deadChange(ctx, e, o) }
		},
	}
}

func outboxDeadDiscardCmd() *command {
	return &command{
		name:      "outbox dead discard",
		summary:   "delete dead outbox rows: their records are never published",
		takesArgs: true,
		usage: `
Usage:
  kscope outbox dead discard (ID... | --all [--outbox NAME]) [--dry-run] [--yes] [--json]

Deletes the dead-letter rows of the identities given (or --all of them, of
--outbox or of every outbox): their records are never published. Consumers
never saw them, except one that saw a row the relay published and
dead-lettered both (when fenced between the two). Discard a row whose
record no longer makes sense once the records of its key that followed it
were published, after writing what it should say anew if anything.

It first prints the rows it would discard. With --dry-run, or without
--yes, it stops there and changes nothing. An ID that is not in the
dead-letter table (requeued or discarded already, or mistyped) is named and
makes it exit 1, after the others are discarded.

Examples:
  kscope outbox dead discard default/3/1042
  kscope outbox dead discard default/3/1042 --yes
  kscope outbox dead discard --all --outbox payments --dry-run
`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			o := &deadOpts{verb: "discard", done: "discarded", f: declareDeadFlags(fs)}
			fs.BoolVar(&o.all, "all", false, "every row of the dead-letter table (of --outbox, when given)")
			fs.BoolVar(&o.dryRun, "dry-run", false, "print the rows it would discard and change nothing")
			fs.BoolVar(&o.yes, "yes", false, "discard them (without it, only the rows are printed)")
			fs.BoolVar(&o.asJSON, "json", false, "print the rows and the outcome as one JSON object")
			return func(ctx context.Context) error { return deadChange(ctx, e, o) }
		},
	}
}

// deadOpts are the options of outbox dead requeue and discard.
type deadOpts struct {
	verb, done          string // "requeue", "requeued"; "discard", "discarded"
	f                   *deadFlags
	all                 bool
	topic               string // requeue only
	dryRun, yes, asJSON bool
}

// deadReport is what requeue and discard --json print.
type deadReport struct {
	Action   string          `json:"action"`
	DryRun   bool            `json:"dry_run"`
	Rows     []deadRowReport `json:"rows"`
	NotFound []string        `json:"not_found"`
	Done     int             `json:"done"`
	Error    string          `json:"error,omitempty"`
}

// deadRowReport is one row of a deadReport.
type deadRowReport struct {
	deadEntry
	// To is the topic a requeue publishes the row to.
	To string `json:"to,omitempty"`
	// Skipped says why the row is left where it is.
	Skipped string `json:"skipped,omitempty"`
	Done    bool   `json:"done"`
	// NewSeq is a requeued row's sequence number at the end of its
	// partition.
	NewSeq int64 `json:"new_seq,omitempty"`

	key []byte
}

// deadChange runs outbox dead requeue or discard: it selects the rows in
// the order the list shows them, prints them, and with --yes changes
// them, one transaction each.
func deadChange(ctx context.Context, e *env, o *deadOpts) error {
	switch {
	case o.all && len(e.args) > 0:
		return usagef("give either row identities or --all, not both")
	case !o.all && len(e.args) == 0:
		return usagef("give the identities of the rows to %s, such as default/3/1042 (see them with 'kscope outbox dead list'), or --all", o.verb)
	case o.topic != "" && !outbox.ValidTopic(o.topic):
		return usagef("--topic %q is not a Kafka topic name; use at most 249 of a-z A-Z 0-9 . _ -", o.topic)
	}
	dl, err := o.f.open(e)
	if err != nil {
		return err
	}
	defer dl.Close()
	listed, err := dl.List(ctx, *o.f.outbox)
	if err != nil {
		return err
	}
	rep := selectDead(o, listed, e.args)
	failed := applyDead(ctx, dl, o, rep)
	result := deadProblems(o, rep, failed)
	if result != nil {
		rep.Error = result.Error()
	}
	if o.asJSON {
		if err := json.NewEncoder(e.stdout).Encode(rep); err != nil {
			return err
		}
		return result
	}
	printDeadChange(e.stdout, o, rep)
	return result
}

// applyDead requeues or discards the rows of rep not skipped, in order,
// when --yes is given without --dry-run, marking each done or why it is
// skipped. It stops at the first failure, which it returns.
func applyDead(ctx context.Context, dl *deadTable, o *deadOpts, rep *deadReport) error {
	if !o.yes || o.dryRun {
		return nil
	}
	for i := range rep.Rows {
		r := &rep.Rows[i]
		if r.Skipped != "" {
			continue
		}
		var err error
		if o.verb == "requeue" {
			var q outbox.Requeued
			q, err = dl.Requeue(ctx, r.ID, o.topic)
			r.NewSeq = q.Seq
		} else {
			err = dl.Discard(ctx, r.ID)
		}
		if errors.Is(err, outbox.ErrNotDead) {
			r.Skipped = "no longer in the dead-letter table: requeued or discarded since it was listed"
			continue
		}
		if err != nil {
			return fmt.Errorf("%s %s failed: %w; %s before it; it and the rows after it are still in the dead-letter table: fix the cause and run the command again",
				o.verb, r.ID, err, plural(rep.Done, "row "+o.done))
		}
		r.Done = true
		rep.Done++
	}
	return nil
}

// deadProblems returns the error that fails the command, naming what was
// not done and why: identities not found, rows skipped, and the failure
// that stopped the changes; nil when everything was done.
func deadProblems(o *deadOpts, rep *deadReport, failed error) error {
	var problems []string
	if len(rep.NotFound) > 0 {
		where := "the dead-letter table"
		if *o.f.outbox != "" {
			where += " of outbox " + *o.f.outbox
		}
		problems = append(problems, "not in "+where+" (requeued or discarded already, or never dead-lettered): "+strings.Join(rep.NotFound, ", "))
	}
	skipped := 0
	for _, r := range rep.Rows {
		if r.Skipped != "" {
			skipped++
		}
	}
	if skipped > 0 {
		problems = append(problems, fmt.Sprintf("%s not %s, for the reason given with each", plural(skipped, "row"), o.done))
	}
	if failed != nil {
		problems = append(problems, failed.Error())
	}
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, "; "))
}

// selectDead returns the report of the rows of listed that o selects (ids,
// or every row with --all), in listed's order, an identity held twice
// once, with the ids that listed lacks.
func selectDead(o *deadOpts, listed []outbox.DeadRow, ids []string) *deadReport {
	rep := &deadReport{Action: o.verb, DryRun: o.dryRun, Rows: []deadRowReport{}, NotFound: []string{}}
	seen := map[string]bool{}
	for _, w := range listed {
		if seen[w.ID] || !o.all && !slices.Contains(ids, w.ID) {
			continue
		}
		seen[w.ID] = true
		r := deadRowReport{deadEntry: toDeadEntry(w), key: w.Key}
		if o.verb == "requeue" {
			r.To = cmp.Or(o.topic, w.Topic)
			if !outbox.ValidTopic(r.To) {
				r.Skipped = fmt.Sprintf("its topic %q is not a Kafka topic name: requeue it with --topic and the topic it was meant for, or discard it", w.Topic)
			}
		}
		rep.Rows = append(rep.Rows, r)
	}
	for _, id := range ids {
		if !seen[id] && !slices.Contains(rep.NotFound, id) {
			rep.NotFound = append(rep.NotFound, id)
		}
	}
	return rep
}

// printDeadChange prints what requeue or discard did, or would do.
func printDeadChange(out io.Writer, o *deadOpts, rep *deadReport) {
	for _, r := range rep.Rows {
		what := fmt.Sprintf("%s (%s, key %s, %d bytes, dead since %s)", escape(r.ID), escape(r.Topic), cell(keyText(r.key), listKeyWidth), r.Bytes, r.DeadAt)
		switch {
		case r.Skipped != "":
			fmt.Fprintf(out, "not %s %s: %s\n", o.done, what, r.Skipped)
		case r.Done && o.verb == "requeue":
			fmt.Fprintf(out, "requeued %s to %s: outbox %s partition %d, sequence number %d\n", what, r.To, escape(r.Outbox), r.Partition, r.NewSeq)
		case r.Done:
			fmt.Fprintf(out, "discarded %s\n", what)
		case o.yes && !o.dryRun:
			// Left by a failure, reported after the list.
		case o.verb == "requeue":
			fmt.Fprintf(out, "would requeue %s to %s, at the end of outbox %s partition %d\n", what, r.To, escape(r.Outbox), r.Partition)
		default:
			fmt.Fprintf(out, "would discard %s: its record is never published\n", what)
		}
	}
	n, todo := len(rep.Rows), 0
	for _, r := range rep.Rows {
		if r.Skipped == "" {
			todo++
		}
	}
	switch {
	case todo == 0:
		fmt.Fprintf(out, "nothing to %s\n", o.verb)
	case o.dryRun:
		fmt.Fprintln(out, "dry run: nothing changed")
	case !o.yes:
		fmt.Fprintf(out, "nothing changed: re-run with --yes to %s %s\n", o.verb, plural(todo, "row"))
	case o.verb == "requeue":
		fmt.Fprintf(out, "requeued %d of %s; the relay publishes them with their identity, after the records of their keys added since they were written\n",
			rep.Done, plural(n, "row"))
	default:
		fmt.Fprintf(out, "discarded %d of %s\n", rep.Done, plural(n, "row"))
	}
}
