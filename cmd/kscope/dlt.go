package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// Table column widths: longer keys and errors are cut.
const (
	listKeyWidth   = 24
	listErrorWidth = 60
	listOwnerWidth = 40
	// listFlushEvery bounds how many table rows are held to align columns.
	listFlushEvery = 1000
)

func dltListCmd() *command {
	return &command{
		name:    "dlt list",
		summary: "list the records of a dead-letter topic with their failure metadata",
		usage: `
Usage:
  kscope dlt list (--topic T | --group G) [filters] [--json]

Reads a dead-letter topic from its start up to the end offsets seen when the
command starts (it never waits for new records), with read-committed
isolation and no consumer group: nothing is committed. Records that a
transaction still open holds back are named in a warning; records deleted
(retention) after the read began and before it reached them fail it. For
each record it
prints the partition, offset, key, attempt count, error class, last failure
time, original topic/partition/offset, owner and error message. Long keys and
messages are cut in the table; --json prints one complete JSON object per
line instead. Records are listed partition by partition, in offset order.

The owner is the record's kscope-owner header (consumer.Config.Owner of the
group that dead-lettered it); for a record without one, with --policy FILE
(or $KSCOPE_POLICY), the file's owner of its group, marked "(policy)"
("owner_source":"policy" in --json). With --group, the table ends with how
many dead letters wait for triage: past the offsets 'kscope dlt redrive
--group' committed under the group <group>.kscope-triage, as the gauge
kscope_dead_letters_waiting counts them.

A record's identity (its kscope-id) can be dead-lettered twice when a
consumer died between the DLT's acknowledgement and the transaction that
remembers it. The table lists an identity once, at its first record, and
ends with the identities seen more than once and their counts; in --json
each line carries "copy", the record's number among its identity's (1 for
the first).

Examples:
  kscope dlt list --group payments
  kscope dlt list --topic payments.kscope-dlt --partition 2 --from-offset 100 --to-offset 200
  kscope dlt list --group payments --class terminal --json | jq .error
  kscope dlt list --group payments --key order-42
`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			f := declareDLTFlags(fs, true)
			asJSON := fs.Bool("json", false, "print one JSON object per record and line")
			return func(ctx context.Context) error { return dltList(ctx, e, f, *asJSON) }
		},
	}
}

// listEntry is one record in dlt list --json.
type listEntry struct {
	Copy      int     `json:"copy"`
	Topic     string  `json:"topic"`
	Partition int32   `json:"partition"`
	Offset    int64   `json:"offset"`
	Timestamp string  `json:"timestamp"`
	Key       *string `json:"key"`
	KeyHex    string  `json:"key_hex,omitempty"`
	metadataJSON
}

// metadataJSON is retrytopic.Metadata as JSON.
type metadataJSON struct {
	ID                string `json:"id"`
	Group             string `json:"group,omitempty"`
	Attempt           int    `json:"attempt"`
	Class             string `json:"class"`
	Error             string `json:"error"`
	FirstFailure      string `json:"first_failure,omitempty"`
	LastFailure       string `json:"last_failure,omitempty"`
	OriginalTopic     string `json:"original_topic"`
	OriginalPartition int32  `json:"original_partition"`
	OriginalOffset    int64  `json:"original_offset"`
	OriginalTimestamp string `json:"original_timestamp,omitempty"`
	Due               string `json:"due,omitempty"`
	Stage             *int   `json:"stage,omitempty"`
	Parked            bool   `json:"parked,omitempty"`
	DecodeWarning     string `json:"decode_warning,omitempty"`
	// Owner is the team that owns the group that dead-lettered the
	// record, and how to reach it; OwnerSource says where it was read:
	// "header" (its kscope-owner header) or "policy" (the entry of its
	// group in the --policy file, for a record without the header).
	Owner       string `json:"owner,omitempty"`
	OwnerSource string `json:"owner_source,omitempty"`
}

func toMetadataJSON(m retrytopic.Metadata, derr error) metadataJSON {
	j := metadataJSON{
		ID:                m.ID,
		Group:             m.Group,
		Attempt:           m.Attempt,
		Class:             m.Class.String(),
		Error:             m.Error,
		FirstFailure:      timeText(m.FirstFailure),
		LastFailure:       timeText(m.LastFailure),
		OriginalTopic:     m.OriginalTopic,
		OriginalPartition: m.OriginalPartition,
		OriginalOffset:    m.OriginalOffset,
		OriginalTimestamp: timeText(m.OriginalTimestamp),
		Due:               timeText(m.Due),
		Parked:            m.Parked,
	}
	if m.Stage >= 0 {
		s := m.Stage
		j.Stage = &s
	}
	if derr != nil {
		j.DecodeWarning = derr.Error()
	}
	return j
}

// timeText renders t in RFC 3339 UTC with milliseconds, "" when zero.
func timeText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// keyJSON returns k as text when it is valid UTF-8, else as hex.
func keyJSON(k []byte) (*string, string) {
	if k == nil {
		return nil, ""
	}
	if utf8.Valid(k) {
		s := string(k)
		return &s, ""
	}
	return nil, hex.EncodeToString(k)
}

// dltList runs dlt list: it reads the dead-letter topic and prints the
// records the filters select, then what it noticed and the totals.
func dltList(ctx context.Context, e *env, f *dltFlags, asJSON bool) error {
	topic, err := f.dltTopic()
	if err != nil {
		return err
	}
	rng, flt, err := f.selection()
	if err != nil {
		return err
	}
	own, err := e.dltOwners(*f.group)
	if err != nil {
		return err
	}
	kc, cl, adm, err := e.kafkaAdmin(*f.brokers, f.timeouts)
	if err != nil {
		return err
	}
	defer cl.Close()

	l := &dltLister{e: e, own: own, flt: flt, asJSON: asJSON, enc: json.NewEncoder(e.stdout), copies: map[string]int{}}
	if !asJSON {
		l.tw = tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	}
	held, err := scan(ctx, kc, adm, topic, rng, l.record)
	if l.tw != nil {
		if ferr := l.tw.Flush(); err == nil {
			err = ferr
		}
	}
	if err != nil {
		return err
	}
	l.finish(topic, held)
	if !asJSON && *f.group != "" {
		printWaiting(ctx, e, adm, kc, *f.group, topic)
	}
	return nil
}

// dltLister prints the records of a dead-letter topic, as a table or as
// JSON lines, and counts them by identity.
type dltLister struct {
	e        *env
	own      *owners // finds each record's owner
	flt      *recordFilter
	asJSON   bool
	n, shown int               // records selected, and rows in the table
	tw       *tabwriter.Writer // the table; nil with --json
	enc      *json.Encoder
	copies   map[string]int // identity -> records seen
	repeated []string       // identities seen more than once, in order
	bare     int            // records without kscope's failure headers
}

// record prints one record the scan read, when the filters select it:
// as a JSON line, or as a table row at its identity's first record.
func (l *dltLister) record(r *kgo.Record) error {
	m, derr := decode(r)
	if !l.flt.match(r, m) {
		return nil
	}
	l.n++
	if !hasHeader(r, retrytopic.HeaderErrorClass) {
		l.bare++
	}
	warnDecode(l.e.stderr, r, derr)
	l.copies[m.ID]++
	if l.copies[m.ID] == 2 {
		l.repeated = append(l.repeated, m.ID)
	}
	if l.asJSON {
		k, kh := keyJSON(r.Key)
		e := listEntry{
			Copy:  l.copies[m.ID],
			Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
			Timestamp: timeText(r.Timestamp), Key: k, KeyHex: kh,
			metadataJSON: toMetadataJSON(m, derr),
		}
		l.own.fill(&e.metadataJSON, m)
		return l.enc.Encode(e)
	}
	if l.copies[m.ID] > 1 {
		return nil // listed at its first record; counted below
	}
	return l.row(r, m)
}

// row writes r's table row, the header before the first; the table is
// flushed every listFlushEvery records.
func (l *dltLister) row(r *kgo.Record, m retrytopic.Metadata) error {
	tw := l.tw
	l.shown++
	if l.shown == 1 {
		fmt.Fprintln(tw, "PARTITION\tOFFSET\tKEY\tATTEMPT\tCLASS\tLAST FAILURE\tORIGINAL\tOWNER\tERROR")
	}
	last := timeText(m.LastFailure)
	if last == "" {
		last = "-"
	}
	fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%s\t%s\t%s/%d/%d\t%s\t%s\n",
		r.Partition, r.Offset, cell(keyText(r.Key), listKeyWidth), m.Attempt, m.Class, last,
		m.OriginalTopic, m.OriginalPartition, m.OriginalOffset, l.own.cell(m, listOwnerWidth), cell(m.Error, listErrorWidth))
	if l.n%listFlushEvery == 0 {
		return tw.Flush()
	}
	return nil
}

// finish warns on stderr of the records held back and of records that do
// not look dead-lettered by kscope, and ends the table with the totals and
// the identities seen more than once.
func (l *dltLister) finish(topic string, held []heldBack) {
	e := l.e
	for _, h := range held {
		fmt.Fprintf(e.stderr, "warning: %s\n", h)
	}
	if l.bare > 0 {
		fmt.Fprintf(e.stderr, "warning: %d of %s in %s carry no kscope failure headers (class, error, original topic): "+
			"it does not look like a kscope dead-letter topic (those are named <group>.kscope-dlt); their class is shown as unknown. Check --topic or --group.\n",
			l.bare, plural(l.n, "record"), topic)
	}
	if !l.asJSON {
		fmt.Fprintf(e.stdout, "%s in %s, %s\n", plural(l.n, "record"), topic, plural(len(l.copies), "identity"))
		for _, id := range l.repeated {
			fmt.Fprintf(e.stdout, "  %s: %d records (dead-lettered again after a crash between the DLT's acknowledgement and its inbox row)\n", id, l.copies[id])
		}
	}
}

// keyText renders a key for the table: text when printable, "(null)", or
// "0x" and hex.
func keyText(k []byte) string {
	switch {
	case k == nil:
		return "(null)"
	case printable(k, false):
		return string(k)
	}
	return "0x" + hex.EncodeToString(k)
}

// cell makes s one table cell: control characters and tabs escaped, cut to
// width runes.
func cell(s string, width int) string {
	out := escape(s)
	if utf8.RuneCountInString(out) > width {
		rs := []rune(out)
		out = string(rs[:width-1]) + "…"
	}
	if out == "" {
		return "-"
	}
	return out
}

// escape writes control characters, tabs and newlines of s as Go escapes,
// so s prints on one line.
func escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\t', r == '\n', r == '\r', !unicode.IsPrint(r):
			b.WriteString(strings.Trim(strconv.QuoteRune(r), "'"))
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// plural renders "1 record", "2 records".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "y") {
		return strconv.Itoa(n) + " " + noun[:len(noun)-1] + "ies"
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// printable reports whether b is valid UTF-8 made of printable characters
// (and, when multiline is set, newlines and tabs).
func printable(b []byte, multiline bool) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsPrint(r) || multiline && (r == '\n' || r == '\t' || r == '\r') {
			continue
		}
		return false
	}
	return true
}

// hasHeader reports whether r carries a header named key.
func hasHeader(r *kgo.Record, key string) bool {
	for _, h := range r.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}
